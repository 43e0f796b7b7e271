"""The OUTLETS draft: SpecForge's EAGLE-3 Llama draft with gated attention and a length head."""
