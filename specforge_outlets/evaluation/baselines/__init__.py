"""Baseline length predictors, one module each, all implementing ``evaluation.predictor_api.Predictor``."""
