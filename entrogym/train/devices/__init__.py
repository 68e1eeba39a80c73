"""How the work maps onto processes and devices: torchrun ranks, FSDP2 sharding, dtypes and
threads."""
