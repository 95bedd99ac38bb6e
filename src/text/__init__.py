"""Text empathy models (issue 6): a frozen or partly fine-tuned transformer encoder with one
regression output per label, persona conditioning, turn-level levels, robustness perturbations,
a scoring web page and an LLM-judge baseline. Entry: `python train.py data=text_csv model=text_regressor`.
"""
