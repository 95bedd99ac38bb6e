"""empathic-fusion: multimodal empathy prediction (EmpathicStories++-style).

Weights are only ever loaded from local folders (e.g. packages that ship them); hub look-ups are
switched off here so that a missing local model fails fast instead of trying the network.
"""
import os

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
os.environ.setdefault("GLOG_minloglevel", "2")  # mediapipe's C++ logging
os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
