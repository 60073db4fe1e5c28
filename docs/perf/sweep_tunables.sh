#!/usr/bin/env bash
# Sweep the Triton einsum / top-k / logits / prefill / mqa / insert / compress tunables on the production shapes (after
# docs/gpu_run.sh installed the wheels): PYTHONPATH=/tmp/site bash docs/perf/sweep_tunables.sh LOG [SECTION...]
# (sections: einsum topk logits prefill mqa insert compress; default all; also einsum-variants topk-warps decode-v).
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
# fp8_einsum variants (B=1024 H=8 R=4096 D=1024 among the production cases): two K steps per iteration, TMA
# descriptors, a warp-specialized K loop; the sm90 defaults are 64 x 128 tiles, 4 warps, 4 stages. Compiled offline
# for sm90 (Triton 3.6; ptxas registers, shared memory): pointers 178 (224 before the one-multiply scaling), 96 KiB;
# tma=1 152, 96 KiB (3 stages: 72 KiB, three programs per SM); unroll=2 doubles the shared memory per stage (2-3
# stages here) and uses 255 registers (spills: 76 bytes with TMA, 600 without). ws=1 makes a loading warp group and
# two 4-warp consumer groups: at 128 rows each consumer takes 64 (168 registers); at 64 rows both compute the same
# tile; with unroll=2 or 8 warps it is not applied. 128 x 128 x 8 warps: 175 registers, 156 with TMA (one program per
# SM); 128 x 256 x 8 warps spills (255) with or without TMA. einsum_persistent=k: k programs per SM loop over the
# tiles (pointers 225 registers, TMA 159-161; ws at 128 rows 168).
want einsum-variants && for c in einsum_tma=0 einsum_unroll=2,einsum_stages=2 \
         einsum_tma=1 einsum_tma=1,einsum_stages=3 einsum_tma=1,einsum_stages=5 \
         einsum_tma=1,einsum_unroll=2,einsum_stages=2 einsum_tma=1,einsum_unroll=2,einsum_stages=3 \
         einsum_tma=1,einsum_ws=1 einsum_tma=1,einsum_ws=1,einsum_block_m=128,einsum_stages=3 \
         einsum_tma=1,einsum_ws=1,einsum_block_m=128,einsum_stages=4 \
         einsum_block_m=128,einsum_warps=8 einsum_tma=1,einsum_block_m=128,einsum_warps=8,einsum_stages=3 \
         einsum_tma=1,einsum_block_m=128,einsum_warps=8 \
         einsum_tma=1,einsum_block_m=128,einsum_warps=8,einsum_unroll=2,einsum_stages=2 \
         einsum_tma=1,einsum_block_m=128,einsum_block_n=256,einsum_warps=8,einsum_stages=3 \
         einsum_tma=1,einsum_block_m=128,einsum_block_n=256,einsum_warps=8,einsum_stages=2 \
         einsum_persistent=2 einsum_tma=1,einsum_persistent=2 einsum_tma=1,einsum_stages=3,einsum_persistent=3 \
         einsum_tma=1,einsum_ws=1,einsum_block_m=128,einsum_stages=3,einsum_persistent=1; do run fp8_einsum $c; done
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
# Output columns per program (decode_block_v / prefill_block_v < 512: 512 / that many programs per head block, adjacent
# in the grid, each scoring the full rows and accumulating only its columns), against the defaults (first of each
# op). Compiled offline for sm90 (Triton 3.6; heads,rows,columns,warps: registers / spills / shared memory; the H100
# has 64K registers and 228 KiB per SM): 64,32,512,8 255 / 8 B / 96 KiB (1 program per SM); 64,32,256,4 255 / 632 B /
# 112 KiB (2); 64,32,256,8 255 / 0 / 112 KiB (1), with decode_maxnreg=128 128 / 256 B (2); 64,64,256,4 255 / 948 B /
# 160 KiB (1); 64,32,128,4 255 / 144 B / 104 KiB (2); 64,16,256,4 255 / 548 B / 88 KiB (2); 64,16,256,8 with
# maxnreg=128 128 / 108 B / 88 KiB (2); 64,32,128,8 with maxnreg=128 128 / 56 B / 104 KiB (2). At 4 warps the spills
# are mostly the wgmma descriptors of the q tile (loop-invariant, reloaded from L1: 64,32,256,4 has 57 local loads
# next to 26 global loads per 32-row step), not the accumulator. decode_waves counts the column programs (2: split the
# index list up to two programs per SM).
want decode-v && for c in decode_block_v=512 decode_block_v=256,decode_warps=4 decode_block_v=256,decode_warps=8 \
         decode_block_v=256,decode_block_k=64,decode_warps=4 decode_block_v=128,decode_warps=4 \
         decode_block_v=256,decode_warps=4,decode_waves=2 decode_block_v=256,decode_warps=8,decode_maxnreg=128 \
         decode_block_v=256,decode_warps=8,decode_maxnreg=128,decode_waves=2 \
         decode_block_v=128,decode_warps=8,decode_maxnreg=128,decode_waves=2 \
         decode_block_v=256,decode_block_k=16,decode_warps=4,decode_waves=2; do run sparse_mla_decode $c; done
want decode-v && for c in prefill_block_v=512 prefill_block_v=256,prefill_warps=4 prefill_block_v=256,prefill_warps=8 \
         prefill_block_v=256,prefill_warps=8,prefill_maxnreg=128; do run sparse_mla_prefill $c; done
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
