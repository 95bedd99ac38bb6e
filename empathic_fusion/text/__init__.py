"""What is truly text-specific: the ridge experts and the fine-tuned encoder expert the text model stacks,
its extra branches (TF-IDF), the baselines its report fits, the perturbations of the robustness report,
the generated demo table and the LLM judge. The text model itself is a model like the others
(empathic_fusion/models/text_module.py), its datamodule a datamodule (empathic_fusion/datamodules/), its
report an evaluation (empathic_fusion/evaluation/text_report.py) and its scorer a scorer
(empathic_fusion/scoring/text.py): `python train.py experiment=text_empathetic_exchanges` runs on the one
path of empathic_fusion/pipeline.py.
"""
