"""Serve the Gradio app (see empathic_fusion/conf/serve.yaml). Same as `empathic-serve`:
    python serve.py ckpt_path=path/to/fusion.ckpt text_ckpt_path=path/to/text.ckpt   (either or both)
"""
from empathic_fusion.cli import serve

if __name__ == "__main__":
    serve()
