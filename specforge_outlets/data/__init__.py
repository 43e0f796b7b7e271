"""Prompts -> regenerated responses -> captured target features with length labels."""
