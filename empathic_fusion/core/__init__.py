"""The bottom layer: parts every other package may use and that use none of them (file helpers, the
sentence encoder, language detection, the branch registry)."""
