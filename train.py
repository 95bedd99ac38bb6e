"""Train a model (see empathic_fusion/conf/train.yaml): a fusion net, python train.py model=lf_lstm modality=v+t,
or a text model, python train.py experiment=text_empathetic_exchanges. Same as `empathic-train`."""
from empathic_fusion.cli import train

if __name__ == "__main__":
    train()
