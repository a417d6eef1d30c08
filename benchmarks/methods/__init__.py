"""Reference implementations of the prompt methods on a frozen timm ViT."""
from . import hide  # noqa: F401  (registers "hide", "norga")
