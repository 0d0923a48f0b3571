"""Teacher signals: the catalog of cached signals, their passes (logits, MC-dropout, features), the shard and
gather protocol, and the checked readers the students use."""
