"""Text empathy models: a frozen or partly fine-tuned transformer encoder with one regression output
per label, stacked ridge experts (TF-IDF, frozen embeddings per field), persona conditioning,
optional extra branches (TF-IDF), turn-level levels, robustness
perturbations and an LLM-judge evaluation. Trained on the one path of empathic_fusion/pipeline.py:
`python train.py experiment=text_empathetic_exchanges` (or data=text_csv model=text_regressor modality=t).

Importing the package registers the text module and its parts (empathic_fusion/core/registry.py), so
the checkpoint loader can rebuild text checkpoints, as timm's models package registers its models.
"""
from empathic_fusion.text import model  # noqa: F401
