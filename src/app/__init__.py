"""The Gradio app of serve.py: a Text tab (src.app.text) and a Clip tab (src.app.clip), built by src.app.ui."""
