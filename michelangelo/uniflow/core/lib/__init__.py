"""Libraries for workflow bodies (``from michelangelo.uniflow.core.lib import concurrent``)."""
