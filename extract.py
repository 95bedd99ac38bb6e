"""Extract features into the store (empathic_fusion/conf/extract.yaml). Same as `empathic-extract`:
    python extract.py data=... features=paper shard=3/16
"""
from empathic_fusion.cli import extract

if __name__ == "__main__":
    extract()
