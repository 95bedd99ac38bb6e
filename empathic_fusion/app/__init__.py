"""The Gradio app of serve.py: a Text tab (empathic_fusion.app.text) and a Clip tab (empathic_fusion.app.clip), built by empathic_fusion.app.ui."""
