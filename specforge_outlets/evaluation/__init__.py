"""``outlets eval``: length-prediction accuracy of OUTLETS against baselines, drafting quality, overhead."""
