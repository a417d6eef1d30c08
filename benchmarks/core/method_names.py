"""The methods' names in tables and figures, and the order of their rows."""

__all__ = ["METHOD_NAMES", "METHOD_ORDER"]

#: Rows follow the paper's method order (its main table, then its cross-ablation), FlyPrompt last.
METHOD_ORDER = {name: i for i, name in enumerate(
    ("seq-ft", "seq-ft-sl", "l2p", "dualprompt", "coda-prompt", "mvp", "misa", "s-prompt", "hide", "norga", "hide-lora",
     "hide-adapter", "sd-lora", "ranpac", "ranpac-frozen", "ranpac-collect", "linear-probe", "flyprompt"))}
METHOD_NAMES = {"seq-ft": "Seq FT", "seq-ft-sl": "Seq FT w/ SL", "l2p": "L2P", "dualprompt": "DualPrompt",
                "coda-prompt": "CODA-P", "mvp": "MVP", "misa": "MISA", "s-prompt": "S-Prompt++", "hide": "HiDe-Prompt",
                "norga": "NoRGa", "hide-lora": "HiDe-LoRA", "hide-adapter": "HiDe-Adapter", "sd-lora": "SD-LoRA",
                "ranpac": "RanPAC†", "ranpac-frozen": "RanPAC‡", "ranpac-collect": "RanPAC*", "linear-probe": "Linear probe",
                "flyprompt": "FlyPrompt"}
