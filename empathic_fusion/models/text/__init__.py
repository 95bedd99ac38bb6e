"""The text model's parts: the ridge experts and the fine-tuned encoder expert it stacks (experts.py,
finetuned_expert.py), its extra branches such as TF-IDF (branches.py) and the fitted-state base they share
(fitted.py). The module that trains them is models/text_module.py."""
