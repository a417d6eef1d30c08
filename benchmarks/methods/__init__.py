"""Reference implementations of the prompt methods on a frozen timm ViT."""
from . import hide  # noqa: F401  (registers "hide", "norga")
from . import l2p, dualprompt, mvp, flyprompt  # noqa: F401  (registers "l2p", "dualprompt", "misa", "mvp", "flyprompt")
