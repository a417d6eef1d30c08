"""The CPU proxy's pretrained backbone and MISA's prompts for it, their checks, and the proxy page's tables
(docs/proxy.md)."""
