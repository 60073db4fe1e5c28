#!/usr/bin/env bash
# Sweep the Triton einsum / top-k / logits / prefill / mqa / insert / compress tunables on the production shapes (after
# tools/gpu_run.sh installed the wheels): PYTHONPATH=/tmp/site bash tools/sweep_tunables.sh LOG [SECTION...]
# (sections: einsum topk logits prefill mqa insert compress; default all; also einsum-variants topk-warps).
log=${1:-/tmp/sweep_tunables.txt}; shift
sections=" ${*:-einsum topk logits prefill mqa insert compress} "
want() { [[ "$sections" == *" $1 "* ]]; }
run() {  # op, config
  echo "== $1 $2" | tee -a "$log"
  DSV4OPS_TRITON_TUNING=$2 timeout 150 python3 -m dsv4ops.cli bench --ops "$1" --backends triton 2>&1 \
    | grep -E " us |Error|wrong" | tee -a "$log"
}
want einsum && for c in einsum_block_m=64,einsum_block_n=128,einsum_warps=4,einsum_stages=4 \
         einsum_block_m=128,einsum_block_n=128,einsum_warps=8,einsum_stages=3 \
         einsum_block_m=128,einsum_block_n=128,einsum_warps=4,einsum_stages=3 \
         einsum_block_m=128,einsum_block_n=256,einsum_warps=8,einsum_stages=3 \
         einsum_block_m=64,einsum_block_n=256,einsum_warps=8,einsum_stages=3 \
         einsum_block_m=64,einsum_block_n=128,einsum_warps=4,einsum_stages=3; do run fp8_einsum $c; done
# fp8_einsum loads (B=1024 H=8 R=4096 D=1024 among the production cases): pointer loads or TMA descriptors (the sm90
# default since session 6); 64 x 128 tiles, 4 warps unless named. Session 6 also measured two K steps per
# iteration, a warp-specialized K loop and persistent programs: none faster, removed (docs/perf/H100-sweep-einsum-variants.txt,
# docs/perf/H100-sweep-einsum-tma.txt).
want einsum-variants && for c in einsum_tma=0 einsum_tma=1 einsum_tma=1,einsum_stages=3 einsum_tma=1,einsum_stages=5 \
         einsum_tma=1,einsum_block_m=128,einsum_warps=8; do run fp8_einsum $c; done
# top-k: the longest resident piece (rows split to fill the GPU)
want topk && for res in 16384 8192 4096; do run indexer_topk topk_resident=$res,topk_min_piece=2048; done
want topk-warps && for kpt in 16 32 64; do run indexer_topk topk_keys_per_thread=$kpt; done
want logits && for c in logits_block_t=64,logits_warps=4 logits_block_t=128,logits_warps=4 \
         logits_block_t=128,logits_warps=8 logits_block_t=256,logits_warps=8 logits_block_t=64,logits_warps=8; \
         do run paged_mqa_logits $c; done
# sparse_mla_prefill (production cases: T=4096, 128 heads 128+1024 and 64 heads 128+512; FlashMLA 2212 / 746 us
# over its workspace alone): heads per program x rows per step x warps x stages. Compiled offline for sm90, every
# setting uses 255 registers and spills (the [64, 512] fp32 accumulator alone takes 128 per thread at 8 warps);
# 64,64,* spills the most, 32,32,4 leaves room for two programs per SM.
want prefill && for c in 64,32,8,1 64,32,8,2 64,16,8,1 64,64,8,1 32,32,4,1; do
  IFS=, read -r h k w s <<< "$c"
  run sparse_mla_prefill prefill_block_h=$h,prefill_block_k=$k,prefill_warps=$w,prefill_stages=$s
done
# mqa_logits (production case T=4096, S=32768 causal): query rows x keys per dot x keys per program x warps x
# stages. Compiled offline for sm90: 2,128,*,8,3 uses 221 registers (255 with clean) without spills; 2,128 at 4
# warps and 4,64 at 8 warps spill.
want mqa && for c in 2,128,2048,8,3 2,128,2048,8,2 2,128,512,8,3 2,128,8192,8,3 2,64,2048,8,3 2,64,2048,4,3 1,128,2048,4,3; do
  IFS=, read -r q s n w st <<< "$c"
  run mqa_logits mqa_block_q=$q,mqa_block_s=$s,mqa_chunk_s=$n,mqa_warps=$w,mqa_stages=$st
done
# qnorm_rope_kv_insert (T=128, H=64 / 128): query heads per program x warps
want insert && for c in 1,4 2,2 2,4 4,2 4,4 4,8 8,4 8,8 16,8; do
  IFS=, read -r h w <<< "$c"
  run qnorm_rope_kv_insert insert_heads=$h,insert_warps=$w
done
# compress_kv_insert (8192-token prefill: C4 fp8_ds_mla, C128 fp8_ds_mla, C4 index keys); the first setting is the
# defaults, the last pools each C128 window in one program as before. Compiled offline for sm90: the C128 pooling
# programs use 220 registers at 64 channels x 16 positions x 4 warps, 128 at 32 channels or at 8 warps.
want compress && for c in compress_warps=4 compress_channels_c128=32 compress_channels_c128=128,compress_pool_warps=8 \
         compress_pool_warps=8 compress_chunk=8 compress_chunk=32 compress_pool_tokens=32 compress_pool_tokens=128 \
         compress_save_elems=2048 compress_save_elems=4096 compress_warps=8 compress_tokens=4 \
         compress_channels_c4=64,compress_pool_tokens=16 compress_channels_c128=512; do
  run compress_kv_insert $c
done
