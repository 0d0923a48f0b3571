# The dataset and the texts beside it (kdpipe.data): the prepared dataset, the unlabelled transfer rows, an
# external OOD set.

stage(
    "prepare",
    "Read the dataset, deduplicate, split (stratified, seeded), assign row_ids.",
    outputs={"out": directory(DATA_DIR)},
    log_file=f"{LOGS}/prepare.log",
    cfg=PLAN.prepare_params(),
)

stage(
    "transfer",
    "The unlabelled transfer rows: read, drop empty, repeated and evaluation texts, cap, number after the data.",
    inputs={"data": DATA_DIR},
    outputs={"out": directory(TRANSFER_DIR)},
    log_file=f"{LOGS}/transfer.log",
    cfg=PLAN.transfer_params(),
)

stage(
    "ood",
    "An external OOD set (evaluate.ood.source): read, drop empty, repeated, dataset and transfer texts.",
    inputs={"data": DATA_DIR, "transfer": [TRANSFER_DIR] if PLAN.has_transfer() else []},
    outputs={"out": directory(OOD_DIR)},
    log_file=f"{LOGS}/ood.log",
    cfg=lambda wc: PLAN.ood_params(),
)
