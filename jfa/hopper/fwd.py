"""DRAFT Hopper forward in Gluon: persistent over a jfa.schedule, TMA loads, wgmma. NOT YET RUN ON A GPU.

Status (2026-11-30): compiles for sm_90 on the CPU (tests/test_aot.py: wgmma, TMA, no spills); it has never
been executed, so it is not registered as a backend. Next: run tests/test_hopper.py on the H200, then add
warp specialization (a TMA producer warp, two consumer warpgroups in ping-pong) and loop peeling.

Glossary as jfa/triton/kernels/common.py. Per CTA (one per SM, num_warps = 8: BLOCK_M = 128 query rows, 16
per warp): for each item (sequence, query tile, head) of its schedule, Q is TMA-loaded once, K/V blocks
stream through a 2-slot shared-memory ring (block j+1 is in flight while block j is multiplied), S = Q K^T
and O += P V run on wgmma (P from registers). Descriptors view q/k/v as 2-D [rows, H*D]; a block that runs
past its sequence reads the next sequence's rows, which the mask hides (keys) or the store skips (queries).
"""
import triton
from triton.experimental import gluon
from triton.experimental.gluon import language as gl
from triton.experimental.gluon.language.nvidia.hopper import mbarrier, tma, warpgroup_mma, warpgroup_mma_wait

LOG2E = gl.constexpr(1.4426950408889634)
LN2 = gl.constexpr(0.6931471805599453)


@gluon.jit
def _kv_load(k_desc, v_desc, k_smem, v_smem, bars, it, row, col):
    """Issue the TMA loads of one K and one V block into ring slot it % 2."""
    slot = it % 2
    bar = bars.index(slot)
    mbarrier.expect(bar, k_desc.block_type.nbytes + v_desc.block_type.nbytes)
    tma.async_copy_global_to_shared(k_desc, [row, col], bar, k_smem.index(slot))
    tma.async_copy_global_to_shared(v_desc, [row, col], bar, v_smem.index(slot))


@gluon.jit
def hopper_fwd_kernel(q_desc, k_desc, v_desc, O, LSE, q_offsets, kv_offsets, tiles, order, sm_start,
                      stride_ot, stride_oh, stride_lh, tile_capacity, heads, qk_scale, LEFT, RIGHT,
                      GROUP: gl.constexpr, HEAD_DIM: gl.constexpr, BLOCK_M: gl.constexpr, BLOCK_N: gl.constexpr,
                      BROADCAST: gl.constexpr, num_warps: gl.constexpr):
    dtype: gl.constexpr = q_desc.dtype
    s_layout: gl.constexpr = gl.NVMMADistributedLayout(version=[3, 0], warps_per_cta=[num_warps, 1],
                                                       instr_shape=[16, BLOCK_N, 16])
    o_layout: gl.constexpr = gl.NVMMADistributedLayout(version=[3, 0], warps_per_cta=[num_warps, 1],
                                                       instr_shape=[16, HEAD_DIM, 16])
    p_layout: gl.constexpr = gl.DotOperandLayout(operand_index=0, parent=o_layout, k_width=2)
    s_rows: gl.constexpr = gl.SliceLayout(1, s_layout)
    s_cols: gl.constexpr = gl.SliceLayout(0, s_layout)
    o_rows: gl.constexpr = gl.SliceLayout(1, o_layout)
    o_cols: gl.constexpr = gl.SliceLayout(0, o_layout)

    q_smem = gl.allocate_shared_memory(dtype, [BLOCK_M, HEAD_DIM], q_desc.layout)
    k_smem = gl.allocate_shared_memory(dtype, [2, BLOCK_N, HEAD_DIM], k_desc.layout)
    v_smem = gl.allocate_shared_memory(dtype, [2, BLOCK_N, HEAD_DIM], v_desc.layout)
    q_bar = gl.allocate_shared_memory(gl.int64, [1], mbarrier.MBarrierLayout())
    kv_bars = gl.allocate_shared_memory(gl.int64, [2, 1], mbarrier.MBarrierLayout())
    mbarrier.init(q_bar, count=1)
    mbarrier.init(kv_bars.index(0), count=1)
    mbarrier.init(kv_bars.index(1), count=1)

    i_sm = gl.program_id(0)
    start = gl.load(sm_start + i_sm)
    end = gl.load(sm_start + i_sm + 1)
    it = 0  # K/V blocks loaded so far by this CTA: slot it % 2, phase (it // 2) & 1
    q_phase = 0
    for idx in range(start, end):
        item = gl.load(order + idx)
        if item >= 0:
            i_tile = item // heads
            i_h = item % heads
            seq = gl.load(tiles + i_tile)
            m0 = gl.load(tiles + tile_capacity + i_tile) * BLOCK_M
            q_start = gl.load(q_offsets + seq)
            q_len = gl.load(q_offsets + seq + 1) - q_start
            kv_start = gl.load(kv_offsets + seq)
            kv_len = gl.load(kv_offsets + seq + 1) - kv_start
            shift = kv_len - q_len
            # key range seen by rows [m0, m_last] (common.key_blocks), and its fully visible middle
            m_last = gl.minimum(m0 + BLOCK_M, q_len) - 1
            lo = (gl.maximum(m0 + shift - LEFT, 0) // BLOCK_N) * BLOCK_N
            hi = gl.minimum(m_last + shift + RIGHT + 1, kv_len)
            full_lo = gl.maximum(((m_last + shift - LEFT + BLOCK_N - 1) // BLOCK_N) * BLOCK_N, lo)
            full_hi = (gl.minimum(m0 + shift + RIGHT + 1, kv_len) // BLOCK_N) * BLOCK_N
            q_row0 = m0 if BROADCAST else q_start + m0
            col = (i_h // GROUP) * HEAD_DIM

            mbarrier.expect(q_bar, q_desc.block_type.nbytes)
            tma.async_copy_global_to_shared(q_desc, [q_row0, i_h * HEAD_DIM], q_bar, q_smem)
            if lo < hi:
                _kv_load(k_desc, v_desc, k_smem, v_smem, kv_bars, it, kv_start + lo, col)
            mbarrier.wait(q_bar, q_phase)
            q_phase ^= 1

            offs_m = m0 + gl.arange(0, BLOCK_M, layout=s_rows)
            m_i = gl.full([BLOCK_M], float("-inf"), gl.float32, layout=s_rows)
            l_i = gl.full([BLOCK_M], 0.0, gl.float32, layout=s_rows)
            acc = gl.full([BLOCK_M, HEAD_DIM], 0.0, gl.float32, layout=o_layout)
            for n0 in range(lo, hi, BLOCK_N):
                slot = it % 2
                if n0 + BLOCK_N < hi:  # prefetch the next block into the other slot
                    _kv_load(k_desc, v_desc, k_smem, v_smem, kv_bars, it + 1, kv_start + n0 + BLOCK_N, col)
                mbarrier.wait(kv_bars.index(slot), (it // 2) & 1)
                s = warpgroup_mma(q_smem, k_smem.index(slot).permute((1, 0)),
                                  gl.full([BLOCK_M, BLOCK_N], 0.0, gl.float32, layout=s_layout), use_acc=False,
                                  is_async=True)
                s = warpgroup_mma_wait(num_outstanding=0, deps=(s, ))
                s = s * qk_scale
                if (n0 < full_lo) | (n0 >= full_hi):  # edge block of the band: mask (peeled loop: TODO)
                    offs_n = n0 + gl.arange(0, BLOCK_N, layout=s_cols)
                    i_shift = gl.expand_dims(offs_m + shift, 1)
                    j = gl.expand_dims(offs_n, 0)
                    vis = (j < kv_len) & (j >= i_shift - LEFT) & (j <= i_shift + RIGHT)
                    s = gl.where(vis, s, float("-inf"))
                m_new = gl.maximum(m_i, gl.max(s, axis=1))
                m_safe = gl.where(m_new == float("-inf"), 0.0, m_new)
                p = gl.exp2(s - gl.expand_dims(m_safe, 1))
                alpha = gl.exp2(m_i - m_safe)
                l_i = l_i * alpha + gl.sum(p, axis=1)
                m_i = m_new
                acc = acc * gl.expand_dims(gl.convert_layout(alpha, o_rows), 1)
                p_op = gl.convert_layout(p.to(dtype), p_layout)
                acc = warpgroup_mma(p_op, v_smem.index(slot), acc, is_async=True)
                acc = warpgroup_mma_wait(num_outstanding=0, deps=(acc, ))
                it += 1

            seen = l_i > 0.0
            lse = gl.where(seen, (m_i + gl.log2(gl.where(seen, l_i, 1.0))) * LN2, float("-inf"))
            inv = gl.convert_layout(1.0 / gl.where(seen, l_i, 1.0), o_rows)
            out = (acc * gl.expand_dims(inv, 1)).to(dtype)
            o_m = m0 + gl.arange(0, BLOCK_M, layout=o_rows)
            o_d = gl.arange(0, HEAD_DIM, layout=o_cols)
            p_o = (O + q_start.to(gl.int64) * stride_ot + i_h * stride_oh
                   + gl.expand_dims(o_m, 1) * stride_ot + gl.expand_dims(o_d, 0))
            gl.store(p_o, out, mask=gl.expand_dims(o_m < q_len, 1))
            gl.store(LSE + i_h * stride_lh + q_start + offs_m, lse, mask=offs_m < q_len)

    mbarrier.invalidate(q_bar)
    mbarrier.invalidate(kv_bars.index(0))
    mbarrier.invalidate(kv_bars.index(1))


def descriptors(q, k, v, block_m: int, block_n: int):
    """Gluon TMA descriptors over q/k/v viewed as 2-D [rows, H*D] (contiguous rows needed)."""
    from triton.experimental.gluon.nvidia.hopper import TensorDescriptor
    dt = {"torch.bfloat16": gl.bfloat16, "torch.float16": gl.float16}[str(q.dtype)]
    d = q.shape[2]

    def desc(x, block_rows):
        x2 = x.reshape(x.shape[0], x.shape[1] * d)
        layout = gl.NVMMASharedLayout.get_default_for([block_rows, d], dt)
        return TensorDescriptor(x2, list(x2.shape), list(x2.stride()), [block_rows, d], layout)
    return desc(q, block_m), desc(k, block_n), desc(v, block_n)


def forward(q, k, v, q_offsets, kv_offsets, scale, left, right, broadcast, block_m=128, block_n=128):
    """-> (out, lse) as jfa.triton.launch.forward. Needs a CUDA device, bf16/fp16, D in 64/128, rows > 0."""
    import math

    import torch

    from ..jagged import kernel_window
    from ..schedule import build
    batch = kv_offsets.numel() - 1
    rows = batch * q.shape[0] if broadcast else q.shape[0]
    hq, d = q.shape[1], q.shape[2]
    out = torch.empty(rows, hq, d, dtype=q.dtype, device=q.device)
    lse = torch.empty(hq, rows, dtype=torch.float32, device=q.device)
    if rows == 0 or batch == 0 or q.shape[0] == 0:
        return out, lse
    if k.shape[0] == 0:  # no keys anywhere (a TMA descriptor needs rows): every query sees nothing
        return out.zero_(), lse.fill_(float("-inf"))
    num_sms = torch.cuda.get_device_properties(q.device).multi_processor_count
    sched = build(q_offsets, kv_offsets, rows, hq, block_m, block_n, left, right, num_sms)
    q_desc, k_desc, v_desc = descriptors(q, k, v, block_m, block_n)
    lk, rk = kernel_window(left, right)
    hopper_fwd_kernel[(num_sms,)](
        q_desc, k_desc, v_desc, out, lse, q_offsets, kv_offsets, sched.tiles, sched.order, sched.sm_start,
        out.stride(0), out.stride(1), lse.stride(0), sched.tiles.shape[1], hq, scale * math.log2(math.e), lk, rk,
        GROUP=hq // k.shape[1], HEAD_DIM=d, BLOCK_M=block_m, BLOCK_N=block_n, BROADCAST=broadcast, num_warps=8)
    return out, lse


__all__ = ["hopper_fwd_kernel", "forward", "descriptors", "triton"]
