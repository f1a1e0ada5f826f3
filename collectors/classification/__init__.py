"""Root-cause classification of interruptions: rules as data (``rules_v1.json``, editable in the
admin as ``ClassificationRule`` rows), NVIDIA's XID catalogue as a table (``xid.py``) and the engine
that applies them (``engine.classify``)."""

from collectors.classification.engine import Verdict, classify

__all__ = ["Verdict", "classify"]
