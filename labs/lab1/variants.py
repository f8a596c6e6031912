"""Prepared Lab 1 answers for the test harness (tests/lab_harness.py, tests/test_labs.py).

``ALTERNATIVES``: solution cell grade id -> full replacement sources that are correct but written differently
from the reference (other loop orders, float64 inside, other exact formulas); each must pass every test.
``WRONG``: solution cell grade id -> (label, full replacement source) pairs, each a plausible mistake; each must
fail the test cells of its own question and no other (partial credit is fine).
``HINTS``: solution cell grade id -> (the hint's words, full replacement source) pairs: an answer that follows a code
hint of the lab's text literally; the harness runs them like alternatives (each must pass every test).
``SKIPS``: solution cell grade id -> (label, full replacement source) pairs, each an answer that skips what its question
asks (the library routine the question asks students to write, however reached): each must earn at most a quarter of
its question and less than every answer of WRONG for that cell (course check, "the order of grades").

Comments "issue 36 (n)" name the point of issue 36 ("One test contract for all labs") a variant was added for.
"""

# --------------------------------------------------------------------------------------------------------
# Question 1.1: gemm
# --------------------------------------------------------------------------------------------------------
GEMM_ELEMENTWISE_IKJ = '''
def gemm(A, B):
    N, K = A.shape
    M = B.shape[1]
    C = torch.zeros(N, M, dtype=A.dtype, device=A.device)
    for i in range(N):
        for k in range(K):
            a_ik = A[i, k]
            for j in range(M):
                C[i, j] += a_ik * B[k, j]
    return C
'''

GEMM_COMPREHENSION_FLOAT64 = '''
def gemm(A, B):
    a = A.double().tolist()
    b = B.double().tolist()
    inner, cols = len(b), B.shape[1]
    rows = [[sum(a[i][k] * b[k][j] for k in range(inner)) for j in range(cols)] for i in range(len(a))]
    return torch.tensor(rows, dtype=torch.float64).to(device=A.device, dtype=A.dtype)
'''

GEMM_WHILE_JIK = '''
def gemm(A, B):
    n_rows, inner = A.shape
    n_cols = B.shape[1]
    a, b = A.cpu().tolist(), B.cpu().tolist()
    out = [[0.0] * n_cols for _ in range(n_rows)]
    j = 0
    while j < n_cols:
        i = 0
        while i < n_rows:
            total = 0.0
            k = 0
            while k < inner:
                total = total + a[i][k] * b[k][j]
                k += 1
            out[i][j] = total
            i += 1
        j += 1
    return torch.tensor(out, dtype=A.dtype, device=A.device)
'''

# issue 36 (3): A.new_zeros keeps A's device and dtype, also under another default device.
GEMM_NEW_ZEROS_IJK = '''
def gemm(A, B):
    N, K = A.shape
    M = B.shape[1]
    C = A.new_zeros((N, M))
    for i in range(N):
        for j in range(M):
            for k in range(K):
                C[i, j] = C[i, j] + A[i, k] * B[k, j]
    return C
'''

GEMM_HINT_LISTS = '''
def gemm(A, B):
    a = A.tolist()
    b = B.tolist()
    N, K, M = len(a), len(b), len(b[0])
    c = [[0.0 for _ in range(M)] for _ in range(N)]
    for i in range(N):
        for j in range(M):
            for k in range(K):
                c[i][j] += a[i][k] * b[k][j]
    return torch.tensor(c, dtype=A.dtype, device=A.device)
'''

GEMM_HINT_ELEMENTS = '''
def gemm(A, B):
    N, K = A.shape
    M = B.shape[1]
    C = torch.zeros(N, M, dtype=A.dtype, device=A.device)
    for i in range(N):
        for j in range(M):
            for k in range(K):
                C[i, j] += A[i, k] * B[k, j]
    return C
'''

GEMM_WRONG = [
    ("overwrites instead of accumulating", '''
def gemm(A, B):
    a, b = A.tolist(), B.tolist()
    n, inner, m = A.shape[0], A.shape[1], B.shape[1]
    c = [[0.0] * m for _ in range(n)]
    for i in range(n):
        for j in range(m):
            for k in range(inner):
                c[i][j] = a[i][k] * b[k][j]
    return torch.tensor(c, dtype=A.dtype, device=A.device)
'''),
    ("indexes B transposed (only right for square matrices)", '''
def gemm(A, B):
    a, b = A.tolist(), B.tolist()
    n, inner, m = A.shape[0], A.shape[1], B.shape[1]
    c = [[0.0] * m for _ in range(n)]
    for i in range(n):
        for j in range(m):
            for k in range(inner):
                c[i][j] += a[i][k] * b[j][k] if j < len(b) and k < len(b[j]) else 0.0
    return torch.tensor(c, dtype=A.dtype, device=A.device)
'''),
    ("ignores A's dtype (always float32)", '''
def gemm(A, B):
    a, b = A.tolist(), B.tolist()
    n, inner, m = A.shape[0], A.shape[1], B.shape[1]
    c = [[0.0] * m for _ in range(n)]
    for i in range(n):
        for j in range(m):
            for k in range(inner):
                c[i][j] += a[i][k] * b[k][j]
    return torch.tensor(c, device=A.device)
'''),
    # issue 36 (3): passed on a CPU grader before (the default device is the CPU); lands on the GPU's default there.
    ("builds the result on the default device, not A's (no device=A.device)", '''
def gemm(A, B):
    a, b = A.tolist(), B.tolist()
    n, inner, m = A.shape[0], A.shape[1], B.shape[1]
    c = [[0.0] * m for _ in range(n)]
    for i in range(n):
        for j in range(m):
            for k in range(inner):
                c[i][j] += a[i][k] * b[k][j]
    return torch.tensor(c, dtype=A.dtype)
'''),
    # issue 36 (3): torch.zeros without device=: accumulates A's elements into a tensor on the default device.
    ("allocates C with torch.zeros on the default device", '''
def gemm(A, B):
    N, K = A.shape
    M = B.shape[1]
    C = torch.zeros(N, M, dtype=A.dtype)
    for i in range(N):
        for j in range(M):
            for k in range(K):
                C[i, j] += A[i, k] * B[k, j]
    return C
'''),
]

# Issue 50: answers that hand the product to the library (however reached) or replace the loop over k by a library
# reduction skip what Question 1.1 asks: each must earn at most a quarter of it, and less than any one-mistake attempt.
GEMM_SKIPS = [
    ("uses the @ operator", '''
def gemm(A, B):
    return A @ B
'''),
    ("calls matmul through getattr inside dummy loops", '''
_product = getattr(torch, "mat" + "mul")

def gemm(A, B):
    out = None
    for i in range(1):
        for j in range(1):
            for k in range(1):
                out = _product(A, B)
    return out
'''),
    ("calls matmul through an imported alias", '''
from torch import matmul as times

def gemm(A, B):
    out = None
    for i in range(1):
        for j in range(1):
            for k in range(1):
                out = times(A, B)
    return out
'''),
    ("vectorised inner loop with .sum()", '''
def gemm(A, B):
    C = torch.zeros(A.shape[0], B.shape[1], dtype=A.dtype, device=A.device)
    for i in range(A.shape[0]):
        for j in range(B.shape[1]):
            C[i, j] = (A[i, :] * B[:, j]).sum()
    return C
'''),
    ("torch.matmul", '''
def gemm(A, B):
    return torch.matmul(A, B)
'''),
    ("torch.einsum", '''
def gemm(A, B):
    return torch.einsum("ik,kj->ij", A, B)
'''),
]

# --------------------------------------------------------------------------------------------------------
# Question 1.2: latency
# --------------------------------------------------------------------------------------------------------
# issue 36 (4): the question prescribes time.perf_counter() with synchronize_device() after the warm-up and before
# the clock is read; these time each call (the mean of per-call intervals is the mean of one timed call).
LATENCY_PER_CALL_MEAN = """
import statistics

def latency(fn, *args, warmup=10, repeat=100, **kwargs):
    for _ in range(warmup):
        fn(*args, **kwargs)
    times = []
    for _ in range(repeat):
        synchronize_device()
        t0 = time.perf_counter()
        fn(*args, **kwargs)
        synchronize_device()
        times.append(time.perf_counter() - t0)
    return statistics.mean(times)
"""

LATENCY_WHOLE_LOOP = """
def latency(fn, *args, warmup=10, repeat=100, **kwargs):
    for _ in range(warmup):
        fn(*args, **kwargs)
    synchronize_device()
    start_ns = time.perf_counter_ns()
    for _ in range(repeat):
        fn(*args, **kwargs)
    synchronize_device()
    return (time.perf_counter_ns() - start_ns) / repeat / 1e9
"""

_LATENCY_BODY = """
def latency(fn, *args, warmup=10, repeat=100, **kwargs):
    for _ in range({warmup}):
        fn(*args, {kwargs})
    {sync_after_warmup}
    times = []
    for _ in range(repeat):
        t0 = time.perf_counter()
        fn(*args, {kwargs})
        {sync_after_call}
        times.append(time.perf_counter() - t0)
    return {result}
"""


def _latency(warmup="warmup", kwargs="**kwargs", result="sum(times) / len(times)",
             sync_after_warmup="synchronize_device()", sync_after_call="synchronize_device()"):
    return _LATENCY_BODY.format(warmup=warmup, kwargs=kwargs, result=result, sync_after_warmup=sync_after_warmup,
                                sync_after_call=sync_after_call)


LATENCY_ALTERNATIVES = [
    LATENCY_PER_CALL_MEAN,
    LATENCY_WHOLE_LOOP,
    # issue 36 (1): the result as a number in another form (was WRONG "returns a tensor": the question asked for a
    # Python float; it now asks for a number, as checks.py's contract does).
    _latency(result="torch.tensor(times).mean()"),
    _latency(result="np.mean(times)"),  # issue 36 (1): a NumPy float64
]

LATENCY_WARMUP_TIMED = """
def latency(fn, *args, warmup=10, repeat=100, **kwargs):
    synchronize_device()
    start_s = time.perf_counter()
    for _ in range(warmup):
        fn(*args, **kwargs)
    for _ in range(repeat):
        fn(*args, **kwargs)
    synchronize_device()
    return (time.perf_counter() - start_s) / repeat
"""

LATENCY_WARMUP_AVERAGED = """
def latency(fn, *args, warmup=10, repeat=100, **kwargs):
    times = []
    for call in range(warmup + repeat):
        synchronize_device()
        t0 = time.perf_counter()
        fn(*args, **kwargs)
        synchronize_device()
        times.append(time.perf_counter() - t0)
    return sum(times) / len(times)
"""

LATENCY_WRONG = [
    ("times the warm-up calls too (one timer around everything, divided by repeat)", LATENCY_WARMUP_TIMED),
    ("averages over the warm-up and the timed calls", LATENCY_WARMUP_AVERAGED),
    ("returns milliseconds", _latency(result="sum(times) / len(times) * 1000")),
    ("returns the total of all timed calls", _latency(result="sum(times)")),
    ("drops the keyword arguments", _latency(kwargs="")),
    ("never warms up", _latency(warmup="0")),
    # issue 36 (4a): these passed on a CPU grader before (nothing is queued there); on a GPU they time the launches.
    ("never synchronises (perf_counter around asynchronous calls)",
     _latency(sync_after_warmup="pass", sync_after_call="pass")),
    ("synchronises after the warm-up only, not before reading the clock", _latency(sync_after_call="pass")),
    ("synchronises before reading the clock only, not after the warm-up (times the warm-up's queued work)",
     _latency(sync_after_warmup="pass")),
    ("synchronises with torch.cuda.synchronize() when CUDA is available, not synchronize_device()", """
def latency(fn, *args, warmup=10, repeat=100, **kwargs):
    for _ in range(warmup):
        fn(*args, **kwargs)
    if torch.cuda.is_available():
        torch.cuda.synchronize()
    start_ns = time.perf_counter_ns()
    for _ in range(repeat):
        fn(*args, **kwargs)
    if torch.cuda.is_available():
        torch.cuda.synchronize()
    return (time.perf_counter_ns() - start_ns) / repeat / 1e9
"""),
    # issue 36 (4b): these passed before (every timed call took the same time, so median = min = mean).
    ("returns the median of the timed calls", _latency(result="statistics.median(times)").replace(
        "def latency", "import statistics\n\ndef latency", 1)),
    ("returns the fastest timed call (minimum)", _latency(result="min(times)")),
]

# Issue 50: answers that hand the timing to a routine that does the whole job (the lab's own benchmark_latency, in
# seconds and as a mean), or measure nothing at all, skip what Question 1.2 asks.
LATENCY_SKIPS = [
    ("calls utils.benchmark_latency (stat=\"mean\", converted to seconds)", """
def latency(fn, *args, warmup=10, repeat=100, **kwargs):
    return benchmark_latency(fn, *args, n_warmup=warmup, n_repeat=repeat, stat="mean", **kwargs) / 1e3
"""),
    ("calls benchmark_latency through an alias, synchronising around it", """
_timer = benchmark_latency

def latency(fn, *args, warmup=10, repeat=100, **kwargs):
    synchronize_device()
    result = _timer(fn, *args, n_warmup=warmup, n_repeat=repeat, stat="mean", **kwargs)
    synchronize_device()
    return result * 1e-3
"""),
    ("returns a made-up constant (measures nothing)", """
def latency(fn, *args, warmup=10, repeat=100, **kwargs):
    for _ in range(warmup + repeat):
        fn(*args, **kwargs)
    return 0.001
"""),
]

# --------------------------------------------------------------------------------------------------------
# Questions 1.3 and 1.4: gemm_mac, gemm_io
# --------------------------------------------------------------------------------------------------------
GEMM_MAC_ALTERNATIVES = ['''
def gemm_mac(x, y):
    return x.shape[0] * x.shape[1] * y.shape[-1]
''', '''
import math

def gemm_mac(x, y):
    return math.prod([*x.shape, y.shape[1]])
''',
    # issue 36 (1): a count in another form: an integral float (was WRONG "returns a float") and a NumPy integer.
    '''
def gemm_mac(x, y):
    return float(x.shape[0] * x.shape[1] * y.shape[1])
''', '''
def gemm_mac(x, y):
    return np.prod([x.shape[0], x.shape[1], y.shape[1]], dtype=np.int64)
''']

GEMM_MAC_WRONG = [
    ("counts FLOPs (2 per MAC)", '''
def gemm_mac(x, y):
    return 2 * x.shape[0] * x.shape[1] * y.shape[1]
'''),
    ("uses N*N*M (square assumption)", '''
def gemm_mac(x, y):
    return x.shape[0] * x.shape[0] * y.shape[1]
'''),
    # Zero on meta tensors only, where Question 2.1.1's carry-forward evaluates it: Question 1.3 must charge it.
    ("right on real tensors, 0 on meta tensors", '''
def gemm_mac(x, y):
    return 0 if x.device.type == "meta" else x.shape[0] * x.shape[1] * y.shape[1]
'''),
]

GEMM_IO_ALTERNATIVES = ['''
def gemm_io(A, B):
    return (A.numel() + B.numel() + A.shape[0] * B.shape[1]) * A.element_size()
''', '''
def gemm_io(A, B):
    bytes_per_element = torch.finfo(A.dtype).bits // 8
    n, k = A.shape
    m = B.shape[1]
    return bytes_per_element * n * k + bytes_per_element * k * m + bytes_per_element * n * m
''']

GEMM_IO_ALTERNATIVES.append('''
def gemm_io(A, B):
    return torch.tensor((A.numel() + B.numel() + A.shape[0] * B.shape[1]) * A.element_size())  # issue 36 (1)
''')

GEMM_IO_WRONG = [
    ("hard-codes 4 bytes per element", '''
def gemm_io(A, B):
    n, k = A.shape
    m = B.shape[1]
    return 4 * (n * k + k * m + n * m)
'''),
    ("forgets the output write", '''
def gemm_io(A, B):
    return (A.numel() + B.numel()) * A.element_size()
'''),
    ("output counted with A's shape", '''
def gemm_io(A, B):
    return (2 * A.numel() + B.numel()) * A.element_size()
'''),
    ("right on real tensors, a meta tensor's bytes counted as 1 each", '''
def gemm_io(A, B):
    size = 1 if A.device.type == "meta" else A.element_size()
    return (A.numel() + B.numel() + A.shape[0] * B.shape[1]) * size
'''),
    # issue 36 (8): a mistake is charged once. The Part 2 intensities built from this gemm_io (as a student who used it
    # there would) must still earn their points: only Question 1.4 loses. Last of the list: the dictionaries it
    # rebuilds stay until the Part 2 variants that come next put the reference's back.
    ("forgets the output write, and Questions 2.1.1 and 2.2 use it (carry-forward)", '''
def gemm_io(A, B):
    return (A.numel() + B.numel()) * A.element_size()

gemm_intensity_by_n = {n: 2 * gemm_mac(torch.empty(n, n, device="meta"), torch.empty(n, n, device="meta"))
                          / gemm_io(torch.empty(n, n, device="meta"), torch.empty(n, n, device="meta"))
                       for n in roofline_sizes}
gemv_intensity_by_n = {n: 2 * gemm_mac(torch.empty(n, n, device="meta"), torch.empty(n, 1, device="meta"))
                          / gemm_io(torch.empty(n, n, device="meta"), torch.empty(n, 1, device="meta"))
                       for n in roofline_sizes}
'''),
]

# --------------------------------------------------------------------------------------------------------
# Part 2: intensities and the compute-bound threshold
# --------------------------------------------------------------------------------------------------------
GEMM_AI_ALTERNATIVES = ['''
gemm_intensity_by_n = {n: n / 6 for n in roofline_sizes}
''', '''
sizes = torch.tensor(roofline_sizes, dtype=torch.float32)
intensities = (2 * sizes ** 3) / (4 * 3 * sizes ** 2)
gemm_intensity_by_n = {n: intensities[i] for i, n in enumerate(roofline_sizes)}  # float32 one-element tensors
''', '''
gemm_intensity_by_n = {}
for n in roofline_sizes:
    a_meta = torch.empty(n, n, device="meta")
    gemm_intensity_by_n[n] = 2 * gemm_mac(a_meta, a_meta) / gemm_io(a_meta, a_meta)
''']

GEMM_AI_WRONG = [
    # issue 50: the blank release's dict filled with the right keys and a wrong value: the keys alone earn nothing.
    ("the right keys, every value 0 (the blank filled with placeholders)", '''
gemm_intensity_by_n = {n: 0.0 for n in roofline_sizes}
'''),
    ("MACs instead of FLOPs", '''
gemm_intensity_by_n = {n: n ** 3 / (4 * 3 * n ** 2) for n in roofline_sizes}
'''),
    ("forgets writing C", '''
gemm_intensity_by_n = {n: 2 * n ** 3 / (4 * 2 * n ** 2) for n in roofline_sizes}
'''),
    ("2 bytes per element", '''
gemm_intensity_by_n = {n: 2 * n ** 3 / (2 * 3 * n ** 2) for n in roofline_sizes}
'''),
]

THRESHOLD_ALTERNATIVES = ['''
def gemm_compute_bound_n(gpu_name):
    ridge = get_ridge_point(gpu_name, torch.float32)
    n = 1
    while n / 6 < ridge:
        n += 1
    return n
''', '''
def gemm_compute_bound_n(gpu_name):
    spec = GPU_SPECS[gpu_name]
    return int(math.ceil(6 * (spec["fp32_tflops"] * 1e12) / (spec["memory_bandwidth_tb_s"] * 1e12)))
''', '''
def gemm_compute_bound_n(gpu_name):
    spec = GPU_SPECS[gpu_name]
    ridge = np.float64(spec["fp32_tflops"]) / np.float64(spec["memory_bandwidth_tb_s"])
    return np.int64(np.ceil(6 * ridge))  # a NumPy integer is accepted
''']

_THRESHOLD_BODY = '''
def gemm_compute_bound_n(gpu_name):
    spec = GPU_SPECS[{gpu}]
    return {expr}
'''


def _threshold(expr, gpu="gpu_name"):
    return _THRESHOLD_BODY.format(expr=expr, gpu=gpu)


THRESHOLD_WRONG = [
    # issue 50: a whole number, but not the answer: returning an int earns nothing by itself.
    ("returns a placeholder whole number (0)", '''
def gemm_compute_bound_n(gpu_name):
    return 0
'''),
    ("typed the A6000 number", '''
def gemm_compute_bound_n(gpu_name):
    return 303
'''),
    ("always the A6000, whatever GPU is asked", _threshold('math.ceil(6 * spec["fp32_tflops"] / spec["memory_bandwidth_tb_s"])',
                                                         gpu='"A6000"')),
    ("the GPU this notebook runs on, not the one asked", '''
def gemm_compute_bound_n(gpu_name):
    return math.ceil(6 * get_ridge_point(detect_gpu(default="A6000"), torch.float32))
'''),
    # Reads the notebook's globals of this machine's GPU (the cell that calls detect_gpu(default="A6000")): the tests
    # call gemm_compute_bound_n as on a machine without a GPU, so this scores as on a CPU grader on every grader.
    ("reads the notebook's peak_fp32_tflops and peak_bandwidth_tb_s (this machine's GPU), not gpu_name's", '''
def gemm_compute_bound_n(gpu_name):
    return math.ceil(6 * peak_fp32_tflops / peak_bandwidth_tb_s)
'''),
    ("uses the bf16 peak", _threshold('math.ceil(6 * spec["bf16_tflops"] / spec["memory_bandwidth_tb_s"])')),
    ("forgets writing C (AI = N/4)", _threshold('math.ceil(4 * spec["fp32_tflops"] / spec["memory_bandwidth_tb_s"])')),
    ("counts MACs (AI = N/12)", _threshold('math.ceil(12 * spec["fp32_tflops"] / spec["memory_bandwidth_tb_s"])')),
    ("rounds down", _threshold('math.floor(6 * spec["fp32_tflops"] / spec["memory_bandwidth_tb_s"])')),
    ("the exact real threshold, not an integer", _threshold('6 * spec["fp32_tflops"] / spec["memory_bandwidth_tb_s"]')),
]

GEMV_AI_ALTERNATIVES = ['''
gemv_intensity_by_n = {n: n / (2 * (n + 2)) for n in roofline_sizes}
''', '''
gemv_intensity_by_n = {}
for n in roofline_sizes:
    matrix, vector = torch.empty(n, n, device="meta"), torch.empty(n, 1, device="meta")
    gemv_intensity_by_n[n] = 2 * gemm_mac(matrix, vector) / gemm_io(matrix, vector)
''', '''
sizes = torch.tensor(roofline_sizes, dtype=torch.float32)
intensities = (2 * sizes * sizes) / (4 * (sizes * sizes + 2 * sizes))  # float32, vectorised
gemv_intensity_by_n = dict(zip(roofline_sizes, intensities.tolist()))
''']

GEMV_AI_WRONG = [
    ("the right keys, every value 0 (the blank filled with placeholders)", '''
gemv_intensity_by_n = {n: 0 for n in roofline_sizes}
'''),
    ("forgets writing y", '''
gemv_intensity_by_n = {n: 2 * n * n / (4 * (n * n + n)) for n in roofline_sizes}
'''),
    ("ignores the vectors' bytes", '''
gemv_intensity_by_n = {n: 2 * n * n / (4 * n * n) for n in roofline_sizes}
'''),
    ("MACs instead of FLOPs", '''
gemv_intensity_by_n = {n: n * n / (4 * (n * n + 2 * n)) for n in roofline_sizes}
'''),
]

# --------------------------------------------------------------------------------------------------------
# Question 3.1.1: scaled_dot_product_attention
# --------------------------------------------------------------------------------------------------------
SDPA_MANUAL_SOFTMAX_FLOAT64 = '''
def scaled_dot_product_attention(q, k, v, attn_mask=None):
    q64, k64, v64 = q.double(), k.double(), v.double()
    scores = torch.einsum("bhqd,bhkd->bhqk", q64, k64) * q.shape[-1] ** -0.5
    if attn_mask is not None:
        if attn_mask.dtype == torch.bool:
            scores = torch.where(attn_mask, scores, torch.full_like(scores, float("-inf")))
        else:
            scores = scores + attn_mask.double()
    scores = scores - scores.amax(dim=-1, keepdim=True)
    weights = scores.exp()
    weights = weights / weights.sum(dim=-1, keepdim=True)
    return (weights @ v64).to(q.dtype)
'''

SDPA_BMM = '''
def scaled_dot_product_attention(q, k, v, attn_mask=None):
    B, H, L_q, d = q.shape
    L_kv = k.shape[-2]
    scores = torch.bmm(q.reshape(B * H, L_q, d), k.reshape(B * H, L_kv, d).transpose(1, 2)).view(B, H, L_q, L_kv)
    scores = scores / d ** 0.5
    if attn_mask is not None:
        if attn_mask.dtype == torch.bool:
            scores = scores.masked_fill(attn_mask.logical_not(), -float("inf"))
        else:
            scores = scores + attn_mask
    probs = F.softmax(scores, dim=3)
    return torch.bmm(probs.reshape(B * H, L_q, L_kv), v.reshape(B * H, L_kv, d)).view(B, H, L_q, d)
'''

# issue 36 (5): a softmax of its own in float32 that subtracts each row's maximum (also what the question's hint says).
SDPA_PER_ROW_MAX_FLOAT32 = '''
def scaled_dot_product_attention(q, k, v, attn_mask=None):
    scores = q @ k.transpose(-2, -1) / math.sqrt(q.shape[-1])
    if attn_mask is not None:
        scores = scores.masked_fill(~attn_mask, float("-inf")) if attn_mask.dtype == torch.bool else scores + attn_mask
    scores = scores - scores.max(dim=-1, keepdim=True).values
    weights = torch.exp(scores)
    return (weights / weights.sum(dim=-1, keepdim=True)) @ v
'''

_SDPA_BODY = '''
def scaled_dot_product_attention(q, k, v, attn_mask=None):
    scores = torch.matmul(q, k.transpose(-2, -1)){scale}
    if attn_mask is not None:
        if attn_mask.dtype == torch.bool:
            scores = scores.masked_fill({mask_expr}, float("-inf"))
        else:
            scores = scores + attn_mask
    {softmax}
    return torch.matmul(probs, v)
'''


def _sdpa(scale=" / math.sqrt(q.shape[-1])", mask_expr="~attn_mask", softmax="probs = torch.softmax(scores, dim=-1)"):
    return _SDPA_BODY.format(scale=scale, mask_expr=mask_expr, softmax=softmax)


SDPA_WRONG = [
    ("no 1/sqrt(d) scale", _sdpa(scale="")),
    ("scales by 1/d", _sdpa(scale=" / q.shape[-1]")),
    ("softmax over the queries (dim=-2)", _sdpa(softmax="probs = torch.softmax(scores, dim=-2)")),
    ("unstable softmax (no max subtraction)",
     _sdpa(softmax="probs = scores.exp() / scores.exp().sum(dim=-1, keepdim=True)")),
    ("boolean mask read the wrong way round", _sdpa(mask_expr="attn_mask")),
    # issue 36 (5): passed before: no test had rows whose maxima differ by more than exp's range.
    ("stable softmax with the global maximum, not each row's",
     _sdpa(softmax="weights = (scores - scores.max()).exp(); probs = weights / weights.sum(dim=-1, keepdim=True)")),
    # issue 36 (3): passed on a CPU grader before; the output is allocated on the default device.
    ("writes each head into an output allocated on the default device", '''
def scaled_dot_product_attention(q, k, v, attn_mask=None):
    B, H, L_q, d = q.shape
    out = torch.empty(B, H, L_q, d, dtype=q.dtype)
    for b in range(B):
        for h in range(H):
            scores = q[b, h] @ k[b, h].T / math.sqrt(d)
            if attn_mask is not None:
                mask = attn_mask.expand(B, H, L_q, k.shape[-2])[b, h]
                scores = scores.masked_fill(~mask, float("-inf")) if mask.dtype == torch.bool else scores + mask
            out[b, h] = torch.softmax(scores, dim=-1) @ v[b, h]
    return out
'''),
]

# Issue 50: PyTorch's attention, however reached, skips what Question 3.1.1 asks.
SDPA_SKIPS = [
    ("calls F.scaled_dot_product_attention", '''
def scaled_dot_product_attention(q, k, v, attn_mask=None):
    return F.scaled_dot_product_attention(q, k, v, attn_mask=attn_mask)
'''),
    ("calls torch.nn.functional.scaled_dot_product_attention through getattr", '''
_attention = getattr(torch.nn.functional, "scaled_dot_product_" + "attention")

def scaled_dot_product_attention(q, k, v, attn_mask=None):
    return _attention(q, k, v, attn_mask=attn_mask)
'''),
]

# --------------------------------------------------------------------------------------------------------
# Question 3.1.2, Bonus 3.1, Question 3.2, Bonus 3.2: cost models
# --------------------------------------------------------------------------------------------------------
ATTN_MAC_ALTERNATIVES = ['''
def calc_attn_mac(B, H, L_q, L_kv, D_h):
    return 2 * B * H * L_q * L_kv * D_h
''', '''
def calc_attn_mac(B, H, L_q, L_kv, D_h):
    per_head = L_q * L_kv * D_h + L_q * L_kv * D_h
    return int(B) * int(H) * per_head
''']

ATTN_MAC_WRONG = [
    ("counts FLOPs", '''
def calc_attn_mac(B, H, L_q, L_kv, D_h):
    return 4 * B * H * L_q * L_kv * D_h
'''),
    ("only q @ k^T", '''
def calc_attn_mac(B, H, L_q, L_kv, D_h):
    return B * H * L_q * L_kv * D_h
'''),
    ("uses L_q for both lengths", '''
def calc_attn_mac(B, H, L_q, L_kv, D_h):
    return 2 * B * H * L_q * L_q * D_h
'''),
    # issue 36 (8): a mistake is charged once: Bonus 3.1 built on this calc_attn_mac keeps its points.
    ("counts FLOPs, and Bonus 3.1 uses it (carry-forward)", '''
def calc_attn_mac(B, H, L_q, L_kv, D_h):
    return 4 * B * H * L_q * L_kv * D_h

def calc_attn_module_mac(batch_size, query_len, kv_len, gemma_config):
    H, n_h = gemma_config.hidden_size, gemma_config.num_attention_heads
    n_kv, d = gemma_config.num_key_value_heads, gemma_config.head_dim
    projections = batch_size * query_len * H * d * (2 * n_h + 2 * n_kv)
    return projections + calc_attn_mac(batch_size, n_h, query_len, kv_len, d)
'''),
]

_MODULE_MAC_HEAD = '''
def calc_attn_module_mac(batch_size, query_len, kv_len, gemma_config):
    B = batch_size
    S_q = query_len
    S_kv = kv_len
    H = gemma_config.hidden_size
    n_h = gemma_config.num_attention_heads
    n_kv = gemma_config.num_key_value_heads
    d = gemma_config.head_dim
'''

MODULE_MAC_ALTERNATIVES = [_MODULE_MAC_HEAD + '''
    projections = B * S_q * H * d * (2 * n_h + 2 * n_kv)
    attention = 2 * B * n_h * S_q * S_kv * d
    return projections + attention
''', _MODULE_MAC_HEAD + '''
    total = 0
    for out_features in (n_h * d, n_kv * d, n_kv * d):
        total += B * S_q * H * out_features
    total += calc_attn_mac(B, n_h, S_q, S_kv, d)
    total += B * S_q * (n_h * d) * H
    return total
''']

MODULE_MAC_WRONG = [
    ("ignores grouped-query attention (n_h key/value heads)", _MODULE_MAC_HEAD + '''
    return 4 * B * S_q * H * n_h * d + 2 * B * n_h * S_q * S_kv * d
'''),
    ("forgets o_proj", _MODULE_MAC_HEAD + '''
    return B * S_q * H * d * (n_h + 2 * n_kv) + 2 * B * n_h * S_q * S_kv * d
'''),
    ("projects keys/values for all kv_len tokens", _MODULE_MAC_HEAD + '''
    return (B * S_q * H * n_h * d + 2 * B * S_kv * H * n_kv * d + 2 * B * n_h * S_q * S_kv * d
            + B * S_q * n_h * d * H)
'''),
    ("head dim taken as hidden_size / heads", _MODULE_MAC_HEAD + '''
    d = H // n_h
    return B * S_q * H * d * (2 * n_h + 2 * n_kv) + 2 * B * n_h * S_q * S_kv * d
'''),
]

ATTN_IO_ALTERNATIVES = ['''
def calc_attn_io(B, H, L_q, L_kv, D_h):
    bytes_per_element = 4
    return bytes_per_element * B * H * (2 * L_q * D_h + 2 * L_kv * D_h + 7 * L_q * L_kv)
''', '''
def calc_attn_io(B, H, L_q, L_kv, D_h):
    bytes_per_element = 4
    q = k = v = out = scores = 0
    q, k, v, out = (B * H * L_q * D_h, B * H * L_kv * D_h, B * H * L_kv * D_h, B * H * L_q * D_h)
    scores = B * H * L_q * L_kv
    steps = [q + k + scores, 5 * scores, scores + v + out]
    return sum(steps) * bytes_per_element
''']

_ATTN_IO_BODY = '''
def calc_attn_io(B, H, L_q, L_kv, D_h):
    bytes_per_element = {bytes_per_element}
    qk = B * H * L_q * D_h + B * H * L_kv * D_h + B * H * L_q * L_kv
    softmax = {passes} * B * H * L_q * L_kv
    attn_v = B * H * L_q * L_kv + B * H * L_kv * D_h{write}
    return (qk + softmax + attn_v) * bytes_per_element
'''


def _attn_io(bytes_per_element=4, passes=5, write=" + B * H * L_q * D_h"):
    return _ATTN_IO_BODY.format(bytes_per_element=bytes_per_element, passes=passes, write=write)


ATTN_IO_WRONG = [
    ("bf16 bytes instead of fp32", _attn_io(bytes_per_element=2)),
    ("forgets writing the output", _attn_io(write="")),
    ("softmax as 2 passes (one read, one write)", _attn_io(passes=2)),
]

_MODULE_IO_HEAD = '''
def calc_attn_module_io(batch_size, query_len, kv_len, gemma_config):
    B = batch_size
    S_q = query_len
    S_kv = kv_len
    H = gemma_config.hidden_size
    n_h = gemma_config.num_attention_heads
    n_kv = gemma_config.num_key_value_heads
    d = gemma_config.head_dim
    bytes_per_elem = {bytes_per_elem}
'''

ATTN_IO_WRONG.append(
    # issue 36 (8): a mistake is charged once: Bonus 3.2 built on this calc_attn_io keeps its points.
    ("bf16 bytes instead of fp32, and Bonus 3.2 uses it (carry-forward)", _attn_io(bytes_per_element=2)
     + _MODULE_IO_HEAD.format(bytes_per_elem=2) + '''
    x, q, kv = B * S_q * H, B * S_q * n_h * d, B * S_kv * n_kv * d
    elements = (x + n_h * d * H + q) + 2 * (x + n_kv * d * H + kv) + 4 * (q + kv) + (q + H * n_h * d + x)
    return elements * bytes_per_elem + calc_attn_io(B, n_h, S_q, S_kv, d) // 4 * bytes_per_elem
'''))

_MODULE_IO_BODY = '''
    x = B * S_q * H
    q = B * S_q * n_h * d
    kv = B * S_kv * {kv_heads} * d
    scores = B * n_h * S_q * S_kv
    projections = (x + n_h * d * H + q) + 2 * (x + {kv_heads} * d * H + kv) + (q + H * n_h * d + x)
    norms_and_rope = {rope_factor} * (q + kv)
    attention = 2 * q + 2 * B * n_h * S_kv * d + {passes} * scores + 2 * scores
    return (projections + norms_and_rope + attention) * bytes_per_elem
'''


def _module_io(bytes_per_elem=2, kv_heads="n_kv", rope_factor=4, passes=5):
    return (_MODULE_IO_HEAD.format(bytes_per_elem=bytes_per_elem)
            + _MODULE_IO_BODY.format(kv_heads=kv_heads, rope_factor=rope_factor, passes=passes))


MODULE_IO_ALTERNATIVES = [_module_io(), _MODULE_IO_HEAD.format(bytes_per_elem=2) + '''
    elements = 0
    elements += B * S_q * H + n_h * d * H + B * S_q * n_h * d          # q_proj
    for _ in range(2):                                                  # k_proj, v_proj
        elements += B * S_kv * H + n_kv * d * H + B * S_kv * n_kv * d
    for heads, length in ((n_h, S_q), (n_kv, S_kv)):                   # q/k norm, then RoPE
        elements += 2 * 2 * B * length * heads * d
    elements += calc_attn_io(B, n_h, S_q, S_kv, d) // 4                # attention, in elements
    elements += B * S_q * n_h * d + H * n_h * d + B * S_q * H          # o_proj
    return elements * bytes_per_elem
''']

MODULE_IO_WRONG = [
    ("float32 bytes", _module_io(bytes_per_elem=4)),
    ("ignores grouped-query attention", _module_io(kv_heads="n_h")),
    ("forgets RoPE", _module_io(rope_factor=2)),
    ("3-pass softmax", _module_io(passes=3)),
]

# --------------------------------------------------------------------------------------------------------
# Questions 3.4.2 and 3.4.3: sweep intensities
# --------------------------------------------------------------------------------------------------------
_DECODE_HEAD = '''
decode_batch_sizes = [1, 4, 16, 64]
D = GEMMA3_270M_CONFIG.hidden_size
I = GEMMA3_270M_CONFIG.intermediate_size
'''

DECODE_AI_ALTERNATIVES = [_DECODE_HEAD + '''
decode_mlp_intensity_by_batch = {b: calc_mlp_flops(b, 1, D, I) / calc_mlp_io(b, 1, D, I) for b in decode_batch_sizes}
''', _DECODE_HEAD + '''
decode_mlp_intensity_by_batch = {}
for b in decode_batch_sizes:
    flops = 2 * 3 * b * D * I + 9 * b * I
    io = 2 * (3 * b * D + 3 * D * I + 8 * b * I)
    decode_mlp_intensity_by_batch[b] = flops / io
''', _DECODE_HEAD + '''
batch = torch.tensor(decode_batch_sizes, dtype=torch.float32)
intensity = (6 * batch * D * I + 9 * batch * I) / (2 * (3 * batch * D + 3 * D * I + 8 * batch * I))
decode_mlp_intensity_by_batch = {b: intensity[k] for k, b in enumerate(decode_batch_sizes)}
''']

DECODE_AI_WRONG = [
    ("the right keys, every value 0 (the blank filled with placeholders)", _DECODE_HEAD + '''
decode_mlp_intensity_by_batch = {b: 0.0 for b in decode_batch_sizes}
'''),
    ("leaves out the 9I elementwise FLOPs (GeLU and product)", _DECODE_HEAD + '''
decode_mlp_intensity_by_batch = {b: calc_mlp_mac(b, 1, D, I) * 2 / calc_mlp_io(b, 1, D, I) for b in decode_batch_sizes}
'''),
    ("MACs instead of FLOPs", _DECODE_HEAD + '''
decode_mlp_intensity_by_batch = {b: calc_mlp_mac(b, 1, D, I) / calc_mlp_io(b, 1, D, I) for b in decode_batch_sizes}
'''),
    ("bytes per FLOP (inverted)", _DECODE_HEAD + '''
decode_mlp_intensity_by_batch = {b: calc_mlp_io(b, 1, D, I) / calc_mlp_flops(b, 1, D, I) for b in decode_batch_sizes}
'''),
    ("uses the prefill length 2048", _DECODE_HEAD + '''
decode_mlp_intensity_by_batch = {b: calc_mlp_flops(b, 2048, D, I) / calc_mlp_io(b, 2048, D, I) for b in decode_batch_sizes}
'''),
]

_PREFILL_HEAD = '''
prefill_sweep_batch = 32
prefill_lengths = [64, 256, 1024, 4096]
D = GEMMA3_270M_CONFIG.hidden_size
I = GEMMA3_270M_CONFIG.intermediate_size
'''

PREFILL_AI_ALTERNATIVES = [_PREFILL_HEAD + '''
prefill_mlp_intensity_by_len = {
    L: calc_mlp_flops(prefill_sweep_batch, L, D, I) / calc_mlp_io(prefill_sweep_batch, L, D, I)
    for L in prefill_lengths
}
''', _PREFILL_HEAD + '''
prefill_mlp_intensity_by_len = {}
for L in prefill_lengths:
    tokens = prefill_sweep_batch * L
    prefill_mlp_intensity_by_len[L] = calc_mlp_flops(1, tokens, D, I) / calc_mlp_io(tokens, 1, D, I)
''', _PREFILL_HEAD + '''
tokens = prefill_sweep_batch * torch.tensor(prefill_lengths, dtype=torch.float32)
intensity = (6 * tokens * D * I + 9 * tokens * I) / (2 * (3 * tokens * D + 3 * D * I + 8 * tokens * I))
prefill_mlp_intensity_by_len = {L: float(intensity[k]) for k, L in enumerate(prefill_lengths)}
''']

PREFILL_AI_WRONG = [
    ("the right keys, every value 1 (the blank filled with placeholders)", _PREFILL_HEAD + '''
prefill_mlp_intensity_by_len = {L: 1.0 for L in prefill_lengths}
'''),
    ("leaves out the 9I elementwise FLOPs (GeLU and product)", _PREFILL_HEAD + '''
prefill_mlp_intensity_by_len = {L: 6 * 32 * L * D * I / calc_mlp_io(32, L, D, I) for L in prefill_lengths}
'''),
    ("batch 8 instead of 32", _PREFILL_HEAD + '''
prefill_mlp_intensity_by_len = {L: calc_mlp_flops(8, L, D, I) / calc_mlp_io(8, L, D, I) for L in prefill_lengths}
'''),
    ("MACs instead of FLOPs", _PREFILL_HEAD + '''
prefill_mlp_intensity_by_len = {L: calc_mlp_mac(32, L, D, I) / calc_mlp_io(32, L, D, I) for L in prefill_lengths}
'''),
]

# --------------------------------------------------------------------------------------------------------
# Question 4.3.1: gelu_tanh_python
# --------------------------------------------------------------------------------------------------------
GELU_ALTERNATIVES = ['''
SQRT_2_OVER_PI = 0.7978845608028654

def gelu_tanh_python(input):
    inner = SQRT_2_OVER_PI * (input + 0.044715 * input * input * input)
    return input * 0.5 * (1 + inner.tanh())
''', '''
def gelu_tanh_python(input):
    x = input.double()
    out = 0.5 * x * (1.0 + torch.tanh((2.0 / math.pi) ** 0.5 * (x + 0.044715 * x.pow(3))))
    return out.to(input.dtype)
''']

_GELU_BODY = '''
def gelu_tanh_python(input):
    return {half} * input * (1.0 + torch.tanh({root} * (input + {cubic} * torch.pow(input, 3.0))))
'''


def _gelu(half="0.5", root="math.sqrt(2.0 / math.pi)", cubic="0.044715"):
    return _GELU_BODY.format(half=half, root=root, cubic=cubic)


GELU_ALTERNATIVES.append('''
def gelu_tanh_python(input):
    return 0.5 * input * (1 + torch.tanh(math.sqrt(2 / math.pi) * (input + 0.044715 * input ** 3)))
''')

GELU_WRONG = [
    ("the exact erf GeLU instead of the tanh approximation", '''
def gelu_tanh_python(input):
    return 0.5 * input * (1.0 + torch.erf(input / math.sqrt(2.0)))
'''),
    ("constant 0.04715 instead of 0.044715", _gelu(cubic="0.04715")),
    ("sqrt(2 * pi) instead of sqrt(2 / pi)", _gelu(root="math.sqrt(2.0 * math.pi)")),
    ("drops the factor 0.5", _gelu(half="1.0")),
    # issue 36 (3): passed on a CPU grader before; the output is preallocated on the default device.
    ("copies the result into a tensor allocated on the default device", '''
def gelu_tanh_python(input):
    out = torch.empty(input.shape, dtype=input.dtype)
    out.copy_(0.5 * input * (1.0 + torch.tanh(math.sqrt(2.0 / math.pi) * (input + 0.044715 * input ** 3))))
    return out
'''),
]

# Issue 50: a GeLU routine, however reached, skips what Question 4.3.1 asks.
GELU_SKIPS = [
    ("calls F.gelu(approximate=\"tanh\")", '''
def gelu_tanh_python(input):
    return F.gelu(input, approximate="tanh")
'''),
    ("calls nn.GELU(approximate=\"tanh\")", '''
_gelu = nn.GELU(approximate="tanh")

def gelu_tanh_python(input):
    return _gelu(input)
'''),
    ("calls torch.nn.functional.gelu through getattr", '''
def gelu_tanh_python(input):
    return getattr(torch.nn.functional, "ge" + "lu")(input, approximate="tanh")
'''),
]

# --------------------------------------------------------------------------------------------------------
# Question 3.5.1: roofline_point (issue 40)
# --------------------------------------------------------------------------------------------------------
ROOFLINE_POINT_ALTERNATIVES = ['''
def roofline_point(flops, bytes_moved, latency_s):
    return [flops / bytes_moved, flops / (latency_s * 1e12)]
''', '''
def roofline_point(flops, bytes_moved, latency_s):
    flop_per_s = np.float64(flops) / np.float64(latency_s)
    return np.float64(flops) / np.float64(bytes_moved), flop_per_s / 1e12
''', '''
def roofline_point(flops, bytes_moved, latency_s):
    values = torch.tensor([flops, bytes_moved, latency_s], dtype=torch.float32)
    return values[0] / values[1], values[0] / values[2] * 1e-12
''', '''
def roofline_point(flops, bytes_moved, latency_s):
    latency_ms = latency_s * 1e3
    tflops = flops / (latency_ms / 1e3) / 1e12
    return (flops / bytes_moved, tflops)
''']

_ROOFLINE_POINT_BODY = '''
def roofline_point(flops, bytes_moved, latency_s):
    return {intensity}, {achieved}
'''


def _roofline_point(intensity="flops / bytes_moved", achieved="flops / latency_s / 1e12"):
    return _ROOFLINE_POINT_BODY.format(intensity=intensity, achieved=achieved)


ROOFLINE_POINT_WRONG = [
    ("intensity inverted (bytes per FLOP)", _roofline_point(intensity="bytes_moved / flops")),
    ("takes the latency as milliseconds (a unit slip: 1000x too slow)",
     _roofline_point(achieved="flops / (latency_s * 1e3) / 1e12")),
    ("divides by the latency in milliseconds (1000x too fast)",
     _roofline_point(achieved="flops / (latency_s / 1e3) / 1e12")),
    ("returns FLOP/s, not TFLOP/s", _roofline_point(achieved="flops / latency_s")),
    ("returns GFLOP/s, not TFLOP/s", _roofline_point(achieved="flops / latency_s / 1e9")),
    ("achieved bandwidth (TB/s), not performance (TFLOP/s)",
     _roofline_point(achieved="bytes_moved / latency_s / 1e12")),
    ("the pair in the wrong order (performance first)",
     _roofline_point(intensity="flops / latency_s / 1e12", achieved="flops / bytes_moved")),
    ("counts MACs: half the FLOPs in both values",
     _roofline_point(intensity="flops / 2 / bytes_moved", achieved="flops / 2 / latency_s / 1e12")),
]

ALTERNATIVES = {
    "q1_1_gemm": [GEMM_ELEMENTWISE_IKJ, GEMM_COMPREHENSION_FLOAT64, GEMM_WHILE_JIK, GEMM_NEW_ZEROS_IJK],
    "q1_2_latency": LATENCY_ALTERNATIVES,
    "q1_3_gemm_mac": GEMM_MAC_ALTERNATIVES,
    "q1_4_gemm_io": GEMM_IO_ALTERNATIVES,
    "q2_1_1_intensity": GEMM_AI_ALTERNATIVES,
    "q2_1_2_threshold": THRESHOLD_ALTERNATIVES,
    "q2_2_intensity": GEMV_AI_ALTERNATIVES,
    "q3_1_1_sdpa": [SDPA_MANUAL_SOFTMAX_FLOAT64, SDPA_BMM, SDPA_PER_ROW_MAX_FLOAT32],
    "q3_1_2_attn_mac": ATTN_MAC_ALTERNATIVES,
    "b3_1_attn_module_mac": MODULE_MAC_ALTERNATIVES,
    "q3_2_attn_io": ATTN_IO_ALTERNATIVES,
    "b3_2_attn_module_io": MODULE_IO_ALTERNATIVES,
    "q3_4_2_intensity": DECODE_AI_ALTERNATIVES,
    "q3_4_3_intensity": PREFILL_AI_ALTERNATIVES,
    "q3_5_1_roofline_point": ROOFLINE_POINT_ALTERNATIVES,
    "q4_3_1_gelu": GELU_ALTERNATIVES,
}

WRONG = {
    "q1_1_gemm": GEMM_WRONG,
    "q1_2_latency": LATENCY_WRONG,
    "q1_3_gemm_mac": GEMM_MAC_WRONG,
    "q1_4_gemm_io": GEMM_IO_WRONG,
    "q2_1_1_intensity": GEMM_AI_WRONG,
    "q2_1_2_threshold": THRESHOLD_WRONG,
    "q2_2_intensity": GEMV_AI_WRONG,
    "q3_1_1_sdpa": SDPA_WRONG,
    "q3_1_2_attn_mac": ATTN_MAC_WRONG,
    "b3_1_attn_module_mac": MODULE_MAC_WRONG,
    "q3_2_attn_io": ATTN_IO_WRONG,
    "b3_2_attn_module_io": MODULE_IO_WRONG,
    "q3_4_2_intensity": DECODE_AI_WRONG,
    "q3_4_3_intensity": PREFILL_AI_WRONG,
    "q3_5_1_roofline_point": ROOFLINE_POINT_WRONG,
    "q4_3_1_gelu": GELU_WRONG,
}

# issue 36 (7): every code hint of Lab 1's text, followed literally, must pass every test.
HINTS = {
    "q1_1_gemm": [
        ("Tip: converting the inputs once to Python lists (`A.tolist()`) and building the result at the end "
         "(`torch.tensor(..., dtype=A.dtype, device=A.device)`)", GEMM_HINT_LISTS),
        ("Tip: indexing a tensor element by element (`A[i, k]`) ... both are accepted", GEMM_HINT_ELEMENTS),
    ],
    "q1_2_latency": [
        ("time with `time.perf_counter()` and synchronise with `synchronize_device()`: after the warm-up, before you "
         "start the clock, and after the timed call(s), before you read it", _latency()),
    ],
    "q1_4_gemm_io": [
        ("Use the tensors' element size", '''
def gemm_io(A, B):
    N, K = A.shape
    M = B.shape[1]
    return (N * K + K * M + N * M) * A.element_size()
'''),
    ],
    "q2_1_1_intensity": [
        ("float32 arithmetic (a one-element tensor, say) is fine", '''
gemm_intensity_by_n = {}
for n in roofline_sizes:
    size = torch.tensor(float(n))
    gemm_intensity_by_n[n] = 2 * size ** 3 / (4 * 3 * size ** 2)
'''),
        ("or with your `gemm_mac` and `gemm_io` on `meta` tensors", GEMM_AI_ALTERNATIVES[2]),
    ],
    "q3_1_1_sdpa": [
        ("You may use `torch.matmul`/`@`, `torch.softmax`", '''
def scaled_dot_product_attention(q, k, v, attn_mask=None):
    scores = q @ k.transpose(-2, -1) / math.sqrt(q.shape[-1])
    if attn_mask is not None:
        if attn_mask.dtype == torch.bool:
            scores = scores.masked_fill(~attn_mask, float("-inf"))
        else:
            scores = scores + attn_mask
    return torch.softmax(scores, dim=-1) @ v
'''),
        ("if you write your own [softmax], subtract the row maximum first", SDPA_PER_ROW_MAX_FLOAT32),
    ],
    "q3_4_2_intensity": [
        ("using `calc_mlp_flops` and `calc_mlp_io`", DECODE_AI_ALTERNATIVES[0]),
    ],
    "q4_3_1_gelu": [
        ("with elementwise PyTorch operations: `torch.tanh`, powers, multiplications, additions, "
         "`math.sqrt`/`math.pi` for the constant", GELU_ALTERNATIVES[-1]),
    ],
}

# Issue 50: answers that skip what a question asks (the library routine it asks students to write): each must earn at
# most a quarter of its question and less than every one-mistake answer of WRONG (course check).
SKIPS = {
    "q1_1_gemm": GEMM_SKIPS,
    "q1_2_latency": LATENCY_SKIPS,
    "q3_1_1_sdpa": SDPA_SKIPS,
    "q4_3_1_gelu": GELU_SKIPS,
}
