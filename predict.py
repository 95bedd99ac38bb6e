"""Score new recordings or a new text table with a trained checkpoint (empathic_fusion/conf/predict.yaml).
Same as `empathic-predict`:
    python predict.py ckpt_path=logs/train/runs/<run> data.dataset_dir=/path/to/new_sessions
    python predict.py ckpt_path=logs/train/runs/<text run> data.path=new_texts.csv
"""
from empathic_fusion.cli import predict

if __name__ == "__main__":
    predict()
