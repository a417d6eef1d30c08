"""The smallest sweep the command-line tests run: one method and variant, the cpu preset's tiny ViT on 3
generated classes of 4 training images (a training takes about a second)."""

import json

TINY_MODEL = {"img_size": 32, "patch_size": 8, "embed_dim": 48, "depth": 4, "num_heads": 3}
TINY = ["--preset", "cpu", "--methods", "l2p", "--variants", "baseline", "--synthetic-classes", "3",
        "--synthetic-train-per-class", "4", "--synthetic-test-per-class", "1", "--num-sessions", "2",
        "--num-experts", "2", "--batch-size", "4", "--model-kwargs", json.dumps(TINY_MODEL), "--no-progress"]
