"""Evaluate a checkpoint or a sweep (see empathic_fusion/conf/evaluate.yaml). Same as `empathic-evaluate`:
    python evaluate.py ckpt_path=path/to.ckpt
    python evaluate.py sweep_dir=logs/train/multiruns/<date>
"""
from empathic_fusion.cli import evaluate

if __name__ == "__main__":
    evaluate()
