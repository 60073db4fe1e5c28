"""DeepSeek-V4 production shapes (docs/ops.md §0): what the full conformance tier and the bench use.

Per model ("flash": V4-Flash, "pro": V4-Pro) at tensor parallelism 1, 2, 4, 8.
"""
HEADS_PER_RANK = {"flash": (64, 32, 16, 8), "pro": (128, 64, 32, 16)}   # TP 1, 2, 4, 8
MAX_HEADS = 128                         # what the attention ops take (docs/ops.md §1, §2)
O_GROUPS_PER_RANK = {"flash": (8, 4, 2, 1), "pro": (16, 8, 4, 2)}
INDEX_TOPK = {"flash": 512, "pro": 1024}
WINDOW = 128
SWA_BLOCK = 64
C4_BLOCK, C128_BLOCK = 64, 2
O_LORA_RANK, O_GROUP_K = 1024, 8 * 512
INDEX_HEADS = 64
V41_INDEX_HEADS = 32                    # DeepSeek-V4.1's indexer (MXFP4 keys, docs/ops.md §3)
CANDIDATE_BLOCK, CANDIDATE_BLOCKS = 8, 2048   # V4.1's two-level indexer: positions per block, blocks per row
ATTENTION_LAYOUTS = ("fp8_ds_mla", "bf16", "fp8_per_tensor")   # the layouts attention reads
