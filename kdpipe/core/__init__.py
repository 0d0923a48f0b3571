"""Infrastructure with no machine learning in it: atomic artifact writes and manifests, code fingerprints, the
GPU pool and the torch device."""
