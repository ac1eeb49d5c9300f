# Prototype (scripts/proto/README.md).
# hand-made merged-reduction variants of kfuse's generated cluster row kernels (prototype)
import re, sys
FENCE = 'asm volatile("" : "+r"'
def X(arr):  # element k of the raw words, as kfuse writes it
    return f"kf_bf16_f32((((k) & 1) ? kf_hi16({arr}[(k) / 8].w[((k) % 8) / 2]) : kf_lo16({arr}[(k) / 8].w[((k) % 8) / 2])))"
def bfly(v, op):
    return "".join(f"    {v} = {op(v, f'__shfl_xor_sync(0xffffffffu, {v}, {m})')};\n" for m in (1,2,4,8,16))
def cut(src, start_pat, nfence):
    i = src.index(start_pat)
    j = i
    for _ in range(nfence):
        j = src.index(FENCE, j + 1)
    j = src.index("  }\n", j) + 4   # end of the fence's loop
    return src[:i], src[j:]
def merged_block(arr, ctas, wpb, barrier_first, body_local, warp_step, final):
    n = ctas * wpb
    return f"""  {{ // merged exchange (prototype)
{body_local}{warp_step}    __shared__ float2 kf_clm[{n}];
    asm volatile("barrier.cluster.wait.aligned;" ::: "memory");
    if (kf_tid == 0) kf_cl_expect(&kf_clbar[0], {n*8});
    if (kf_lane < {ctas}) {{ kf_cl_push_f32(&kf_clm[kf_crank * {wpb} + kf_warp].x, kf_pa, &kf_clbar[0], kf_lane); kf_cl_push_f32(&kf_clm[kf_crank * {wpb} + kf_warp].y, kf_pb, &kf_clbar[0], kf_lane); }}
    kf_cl_wait(&kf_clbar[0]);
{final}  }}
  _Pragma("unroll") for (int g = 0; g < 8; ++g) {{ asm volatile("" : "+r"({arr}[g].w[0]), "+r"({arr}[g].w[1]), "+r"({arr}[g].w[2]), "+r"({arr}[g].w[3])); }}
"""
def softmax(src, ctas):
    pre, post = cut(src, "  float v6[1];\n", 2)
    arr = "v4w"; n = ctas * 8
    local = f"""    float kf_m = (-KF_INF);
    #pragma unroll
    for (int k = 0; k < 64; ++k) kf_m = fmaxf(kf_m, {X(arr)});
    _Pragma("unroll") for (int g = 0; g < 8; ++g) {{ asm volatile("" : "+r"({arr}[g].w[0]), "+r"({arr}[g].w[1]), "+r"({arr}[g].w[2]), "+r"({arr}[g].w[3])); }}
    const float kf_sh = kf_m == (-KF_INF) ? 0.0f : kf_m;
    float kf_s = 0.0f;
    #pragma unroll
    for (int k = 0; k < 64; ++k) kf_s += kf_exp({X(arr)} - kf_sh);
"""
    corr = lambda m, s, M: f"(({m}) == (-KF_INF) ? (({M}) == (-KF_INF) ? KF_NAN : ({s}) * 0.0f) : ({s}) * kf_exp(({m}) - ({M})))"
    warp = f"""    float kf_pa = kf_m;
{bfly('kf_pa', lambda a, b: f'fmaxf({a}, {b})')}    float kf_pb = {corr('kf_m', 'kf_s', 'kf_pa')};
{bfly('kf_pb', lambda a, b: f'{a} + {b}')}"""
    final = f"""    float kf_M = (-KF_INF);
    #pragma unroll
    for (int i = 0; i < {n // 32}; ++i) kf_M = fmaxf(kf_M, kf_clm[i * 32 + kf_lane].x);
{bfly('kf_M', lambda a, b: f'fmaxf({a}, {b})')}    float kf_S = 0.0f;
    #pragma unroll
    for (int i = 0; i < {n // 32}; ++i) {{ const float2 p = kf_clm[i * 32 + kf_lane]; kf_S += {corr('p.x', 'p.y', 'kf_M')}; }}
{bfly('kf_S', lambda a, b: f'{a} + {b}')}    v6[0] = kf_M; v13[0] = kf_S;
"""
    return pre + "  float v6[1]; float v13[1];\n" + merged_block(arr, ctas, 8, True, local, warp, final) + "  const long long v11 = v0;\n  const long long v12 = 0LL;\n" + post
def layernorm(src, ctas, N):
    pre, post = cut(src, "  float v7[1];  // mu\n", 2)
    arr = "v5w"; n = ctas * 8
    local = f"""    float kf_s1 = 0.0f;
    #pragma unroll
    for (int k = 0; k < 64; ++k) kf_s1 += {X(arr)};
    _Pragma("unroll") for (int g = 0; g < 8; ++g) {{ asm volatile("" : "+r"({arr}[g].w[0]), "+r"({arr}[g].w[1]), "+r"({arr}[g].w[2]), "+r"({arr}[g].w[3])); }}
    const float kf_mt = kf_s1 * (1.0f / 64.0f);
    float kf_q = 0.0f;
    #pragma unroll
    for (int k = 0; k < 64; ++k) {{ const float d = {X(arr)} - kf_mt; kf_q += d * d; }}
"""
    warp = f"""    float kf_pa = kf_s1;
{bfly('kf_pa', lambda a, b: f'{a} + {b}')}    const float kf_dw = kf_mt - kf_pa * (1.0f / 2048.0f);
    float kf_pb = kf_q + 64.0f * kf_dw * kf_dw;
{bfly('kf_pb', lambda a, b: f'{a} + {b}')}"""
    final = f"""    float kf_S = 0.0f;
    #pragma unroll
    for (int i = 0; i < {n // 32}; ++i) kf_S += kf_clm[i * 32 + kf_lane].x;
{bfly('kf_S', lambda a, b: f'{a} + {b}')}    const float kf_mu = kf_S / (float)({N});
    float kf_M2 = 0.0f;
    #pragma unroll
    for (int i = 0; i < {n // 32}; ++i) {{ const float2 p = kf_clm[i * 32 + kf_lane]; const float d = p.x * (1.0f / 2048.0f) - kf_mu; kf_M2 += p.y + 2048.0f * d * d; }}
{bfly('kf_M2', lambda a, b: f'{a} + {b}')}    v7[0] = kf_mu; v12[0] = kf_M2;
"""
    return pre + "  float v7[1]; float v12[1];\n" + merged_block(arr, ctas, 8, True, local, warp, final) + post
for f, ctas, N in [("softmax_1024x131072.cu", 8, 131072), ("softmax_256x262144.cu", 16, 262144), ("layer_norm_1024x131072.cu", 8, 131072), ("layer_norm_256x262144.cu", 16, 262144)]:
    s = open(f).read()
    out = softmax(s, ctas) if f.startswith("softmax") else layernorm(s, ctas, N)
    out = out.replace("kf_clbar[2]", "kf_clbar[1]").replace("i < 2; ++i) kf_cl_init", "i < 1; ++i) kf_cl_init")
    open(f.replace(".cu", "_merged.cu"), "w").write(out)
