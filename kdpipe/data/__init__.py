"""The dataset: preparing it from the sources, reading the prepared artifact, class subsets and batching."""
