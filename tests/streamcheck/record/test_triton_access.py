"""The Triton kernel analysis (streamcheck/record/triton_access.py) on real-looking kernels written as
source strings: which parameters are written, which read, which undecided and why. No triton
needed: the analysis reads the source and never imports it."""
from __future__ import annotations

import textwrap

import pytest

from streamcheck.record.triton_access import Source, analyze

VECTOR_ADD = '''
@triton.jit
def add_kernel(x_ptr, y_ptr, output_ptr, n_elements, BLOCK_SIZE: tl.constexpr):
    pid = tl.program_id(axis=0)
    block_start = pid * BLOCK_SIZE
    offsets = block_start + tl.arange(0, BLOCK_SIZE)
    mask = offsets < n_elements
    x = tl.load(x_ptr + offsets, mask=mask)
    y = tl.load(y_ptr + offsets, mask=mask)
    output = x + y
    tl.store(output_ptr + offsets, output, mask=mask)
'''

SOFTMAX = '''
@triton.jit
def softmax_kernel(output_ptr, input_ptr, input_row_stride, output_row_stride, n_rows, n_cols,
                   BLOCK_SIZE: tl.constexpr, num_stages: tl.constexpr):
    row_start = tl.program_id(0)
    row_step = tl.num_programs(0)
    for row_idx in tl.range(row_start, n_rows, row_step, num_stages=num_stages):
        row_start_ptr = input_ptr + row_idx * input_row_stride
        col_offsets = tl.arange(0, BLOCK_SIZE)
        input_ptrs = row_start_ptr + col_offsets
        mask = col_offsets < n_cols
        row = tl.load(input_ptrs, mask=mask, other=-float('inf'))
        row_minus_max = row - tl.max(row, axis=0)
        numerator = tl.exp(row_minus_max)
        denominator = tl.sum(numerator, axis=0)
        softmax_output = numerator / denominator
        output_row_start_ptr = output_ptr + row_idx * output_row_stride
        output_ptrs = output_row_start_ptr + col_offsets
        tl.store(output_ptrs, softmax_output, mask=mask)
'''

MATMUL_BLOCK_PTR = '''
@triton.jit
def matmul_kernel(a_ptr, b_ptr, c_ptr, M, N, K, stride_am, stride_ak, stride_bk, stride_bn, stride_cm, stride_cn,
                  BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr):
    pid_m = tl.program_id(0)
    pid_n = tl.program_id(1)
    a_block_ptr = tl.make_block_ptr(base=a_ptr, shape=(M, K), strides=(stride_am, stride_ak),
                                    offsets=(pid_m * BLOCK_M, 0), block_shape=(BLOCK_M, BLOCK_K), order=(1, 0))
    b_block_ptr = tl.make_block_ptr(base=b_ptr, shape=(K, N), strides=(stride_bk, stride_bn),
                                    offsets=(0, pid_n * BLOCK_N), block_shape=(BLOCK_K, BLOCK_N), order=(1, 0))
    accumulator = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
    for k in range(0, K, BLOCK_K):
        a = tl.load(a_block_ptr, boundary_check=(0, 1))
        b = tl.load(b_block_ptr, boundary_check=(0, 1))
        accumulator += tl.dot(a, b)
        a_block_ptr = tl.advance(a_block_ptr, (0, BLOCK_K))
        b_block_ptr = tl.advance(b_block_ptr, (BLOCK_K, 0))
    c = accumulator.to(tl.float16)
    c_block_ptr = tl.make_block_ptr(base=c_ptr, shape=(M, N), strides=(stride_cm, stride_cn),
                                    offsets=(pid_m * BLOCK_M, pid_n * BLOCK_N), block_shape=(BLOCK_M, BLOCK_N),
                                    order=(1, 0))
    tl.store(c_block_ptr, c, boundary_check=(0, 1))
'''

MATMUL_POINTERS = '''
@triton.jit
def matmul_kernel(a_ptr, b_ptr, c_ptr, M, N, K, stride_am, stride_ak, stride_bk, stride_bn, stride_cm, stride_cn,
                  BLOCK_SIZE_M: tl.constexpr, BLOCK_SIZE_N: tl.constexpr, BLOCK_SIZE_K: tl.constexpr,
                  GROUP_SIZE_M: tl.constexpr, ACTIVATION: tl.constexpr):
    pid = tl.program_id(axis=0)
    num_pid_m = tl.cdiv(M, BLOCK_SIZE_M)
    num_pid_n = tl.cdiv(N, BLOCK_SIZE_N)
    num_pid_in_group = GROUP_SIZE_M * num_pid_n
    group_id = pid // num_pid_in_group
    first_pid_m = group_id * GROUP_SIZE_M
    group_size_m = min(num_pid_m - first_pid_m, GROUP_SIZE_M)
    pid_m = first_pid_m + ((pid % num_pid_in_group) % group_size_m)
    pid_n = (pid % num_pid_in_group) // group_size_m
    offs_am = (pid_m * BLOCK_SIZE_M + tl.arange(0, BLOCK_SIZE_M)) % M
    offs_bn = (pid_n * BLOCK_SIZE_N + tl.arange(0, BLOCK_SIZE_N)) % N
    offs_k = tl.arange(0, BLOCK_SIZE_K)
    a_ptrs = a_ptr + (offs_am[:, None] * stride_am + offs_k[None, :] * stride_ak)
    b_ptrs = b_ptr + (offs_k[:, None] * stride_bk + offs_bn[None, :] * stride_bn)
    accumulator = tl.zeros((BLOCK_SIZE_M, BLOCK_SIZE_N), dtype=tl.float32)
    for k in range(0, tl.cdiv(K, BLOCK_SIZE_K)):
        a = tl.load(a_ptrs, mask=offs_k[None, :] < K - k * BLOCK_SIZE_K, other=0.0)
        b = tl.load(b_ptrs, mask=offs_k[:, None] < K - k * BLOCK_SIZE_K, other=0.0)
        accumulator = tl.dot(a, b, accumulator)
        a_ptrs += BLOCK_SIZE_K * stride_ak
        b_ptrs += BLOCK_SIZE_K * stride_bk
    if ACTIVATION == "leaky_relu":
        accumulator = tl.where(accumulator >= 0, accumulator, 0.01 * accumulator)
    c = accumulator.to(tl.float16)
    offs_cm = pid_m * BLOCK_SIZE_M + tl.arange(0, BLOCK_SIZE_M)
    offs_cn = pid_n * BLOCK_SIZE_N + tl.arange(0, BLOCK_SIZE_N)
    c_ptrs = c_ptr + stride_cm * offs_cm[:, None] + stride_cn * offs_cn[None, :]
    c_mask = (offs_cm[:, None] < M) & (offs_cn[None, :] < N)
    tl.store(c_ptrs, c, mask=c_mask)
'''

ATOMICS = '''
@triton.jit
def histogram_kernel(data_ptr, hist_ptr, lock_ptr, total_ptr, n, NUM_BINS: tl.constexpr, BLOCK: tl.constexpr):
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    mask = offs < n
    bins = tl.load(data_ptr + offs, mask=mask, other=0).to(tl.int32)
    tl.atomic_add(hist_ptr + bins, 1, mask=mask)
    while tl.atomic_cas(lock_ptr, 0, 1) == 1:
        pass
    tl.atomic_max(pointer=total_ptr, val=tl.sum(mask.to(tl.int32), axis=0))
    tl.atomic_xchg(lock_ptr, 0)
'''

LOOP_CARRIED = '''
@triton.jit
def running_sum_kernel(x_ptr, out_ptr, n_rows, stride, BLOCK: tl.constexpr):
    cols = tl.arange(0, BLOCK)
    src = x_ptr + cols
    acc = tl.zeros((BLOCK,), tl.float32)
    for r in range(n_rows):
        if r > 0:
            tl.store(dst, acc)  # dst is assigned below: it reaches here on the next iteration
        acc += tl.load(src)
        src += stride
        dst = out_ptr + r * stride + cols
'''

LOAD_ONLY = '''
@triton.jit
def check_equal_kernel(x_ptr, y_ptr, n, BLOCK: tl.constexpr):
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    mask = offs < n
    x = tl.load(x_ptr + offs, mask=mask)
    y = tl.load(y_ptr + offs, mask=mask)
    tl.device_assert(tl.sum((x != y).to(tl.int32), axis=0) == 0, "x != y")
'''


def exact(access, *, writes=(), reads=(), undecided=(), constexprs=()):
    assert (set(access.writes), set(access.reads), set(access.undecided), set(access.constexprs)) == \
        (set(writes), set(reads), set(undecided), set(constexprs))


def test_vector_add_writes_its_output_only():
    access = analyze(VECTOR_ADD)
    exact(access, writes={"output_ptr"}, reads={"x_ptr", "y_ptr", "n_elements"}, constexprs={"BLOCK_SIZE"})
    assert access.name == "add_kernel"
    assert access.evidence["output_ptr"] == "tl.store at line 11"
    assert access.spec() == {0: "r", 1: "r", 2: "w", 3: "r", 4: "-"}
    assert access.assumed() == "" and access.notes == ()


def test_softmax_row_pointers_through_strides_and_a_tl_range_loop():
    exact(analyze(SOFTMAX), writes={"output_ptr"},
          reads={"input_ptr", "input_row_stride", "output_row_stride", "n_rows", "n_cols"},
          constexprs={"BLOCK_SIZE", "num_stages"})


@pytest.mark.parametrize("source", [MATMUL_BLOCK_PTR, MATMUL_POINTERS], ids=["block-pointers", "pointer-blocks"])
def test_matmul_writes_c_whether_through_block_pointers_or_pointer_blocks(source):
    access = analyze(source)
    scalars = {"M", "N", "K", "stride_am", "stride_ak", "stride_bk", "stride_bn", "stride_cm", "stride_cn"}
    assert set(access.writes) == {"c_ptr"}
    assert set(access.reads) == {"a_ptr", "b_ptr"} | scalars
    assert dict(access.undecided) == {}


def test_block_pointers_advanced_in_a_loop_keep_their_base():
    source = '''
    def k(in_ptr, out_ptr, N, BLOCK: tl.constexpr):
        src = tl.make_block_ptr(in_ptr, (N,), (1,), (0,), (BLOCK,), (0,))
        dst = tl.make_block_ptr(base=out_ptr, shape=(N,), strides=(1,), offsets=(0,), block_shape=(BLOCK,), order=(0,))
        for i in range(0, N, BLOCK):
            tl.store(dst, tl.load(src))
            src = src.advance((BLOCK,))
            dst = tl.advance(dst, (BLOCK,))
    '''
    exact(analyze(source), writes={"out_ptr"}, reads={"in_ptr", "N"}, constexprs={"BLOCK"})


def test_every_atomic_that_writes_makes_its_pointer_written():
    access = analyze(ATOMICS)
    exact(access, writes={"hist_ptr", "lock_ptr", "total_ptr"}, reads={"data_ptr", "n"},
          constexprs={"NUM_BINS", "BLOCK"})
    assert access.evidence["lock_ptr"].startswith("tl.atomic_cas")  # the first one seen
    assert access.evidence["total_ptr"].startswith("tl.atomic_max")  # given as pointer=


def test_atomic_load_reads():
    source = '''
    def k(flag_ptr, out_ptr):
        while tl.atomic_load(flag_ptr, sem="acquire") == 0:
            pass
        tl.store(out_ptr, 1)
    '''
    exact(analyze(source), writes={"out_ptr"}, reads={"flag_ptr"})


def test_a_store_through_a_pointer_computed_in_a_loop_reaches_its_parameter():
    exact(analyze(LOOP_CARRIED), writes={"out_ptr"}, reads={"x_ptr", "n_rows", "stride"}, constexprs={"BLOCK"})


def test_one_variable_reused_for_a_load_then_a_store_leaves_the_loaded_parameter_read():
    source = '''
    def copy_kernel(x_ptr, y_ptr, n, BLOCK: tl.constexpr):
        offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
        ptrs = x_ptr + offs
        x = tl.load(ptrs, mask=offs < n)
        ptrs = y_ptr + offs
        tl.store(ptrs, x, mask=offs < n)
    '''
    exact(analyze(source), writes={"y_ptr"}, reads={"x_ptr", "n"}, constexprs={"BLOCK"})


def test_both_branches_of_an_if_reach_the_store():
    source = '''
    def k(a_ptr, b_ptr, c_ptr, flag):
        if flag:
            p = a_ptr
        else:
            p = b_ptr
        tl.store(p, tl.load(c_ptr))
        q = tl.where(flag > 0, a_ptr, c_ptr)
    '''
    exact(analyze(source), writes={"a_ptr", "b_ptr"}, reads={"c_ptr", "flag"})


def test_pointer_helpers_and_casts_keep_the_pointer():
    source = '''
    def k(x_ptr, out_ptr, n, BLOCK: tl.constexpr):
        offs = tl.multiple_of(tl.program_id(0) * BLOCK, BLOCK) + tl.arange(0, BLOCK)
        x = tl.load(x_ptr + offs).to(tl.float32)
        p = tl.broadcast_to((out_ptr + offs)[:, None], (BLOCK, 2)).to(tl.pointer_type(tl.float32))
        tl.store(p, tl.reshape(x, (BLOCK, 2)))
    '''
    exact(analyze(source), writes={"out_ptr"}, reads={"x_ptr", "n"}, constexprs={"BLOCK"})


def test_a_kernel_that_only_loads_writes_nothing():
    access = analyze(LOAD_ONLY)
    exact(access, reads={"x_ptr", "y_ptr", "n"}, constexprs={"BLOCK"})
    assert access.spec() == {0: "r", 1: "r", 2: "r", 3: "-"}


def test_constexpr_spellings():
    source = '''
    def k(x_ptr, A: tl.constexpr, B: triton.language.constexpr, C: "tl.constexpr", D: constexpr, E: int = 3):
        tl.store(x_ptr, A + B + C + D + E)
    '''
    exact(analyze(source), writes={"x_ptr"}, reads={"E"}, constexprs={"A", "B", "C", "D"})


# --- jitted helpers ---------------------------------------------------------------------------

HELPERS = {
    "_store_tile": '''
@triton.jit
def _store_tile(ptr, offs, val, mask):
    tl.store(ptr + offs, val, mask=mask)
''',
    "_row": '''
@triton.jit
def _row(base, row, stride):
    return base + row * stride
''',
    "ops.load_row": '''
@triton.jit
def load_row(ptr, offs):
    return tl.load(ptr + offs)
''',
}

SCALE_KERNEL = '''
@triton.jit
def scale_kernel(x_ptr, out_ptr, n, scale, BLOCK: tl.constexpr):
    pid = tl.program_id(0)
    offs = tl.arange(0, BLOCK)
    x = ops.load_row(_row(x_ptr, pid, n), offs)
    _store_tile(_row(out_ptr, pid, n), offs, x * scale, mask=offs < n)
'''


def helper_source(text: str, name: str = "kernel") -> Source:
    def resolve(dotted):
        found = HELPERS.get(dotted)
        return Source(found, name=dotted, resolve=resolve) if found is not None else None
    return Source(text, name=name, resolve=resolve)


def test_a_helper_the_analysis_cannot_read_makes_the_pointers_it_gets_undecided():
    access = analyze(SCALE_KERNEL)
    exact(access, reads={"scale"}, undecided={"x_ptr", "out_ptr", "n"}, constexprs={"BLOCK"})
    assert "`_row`, which the analysis cannot read" in access.undecided["out_ptr"]
    assert access.spec()[1] == "w"  # undecided counts as written
    line = access.assumed({"out_ptr"})
    assert line.startswith("Triton kernel `scale_kernel`: assumed written")
    assert "`out_ptr`" in line and "`x_ptr`" not in line and "declare_kernel('scale_kernel'" in line


def test_jitted_helpers_are_followed_when_they_can_be_resolved():
    access = analyze(helper_source(SCALE_KERNEL, "scale_kernel"))
    exact(access, writes={"out_ptr"}, reads={"x_ptr", "n", "scale"}, constexprs={"BLOCK"})
    assert access.evidence["out_ptr"] == "`_store_tile` at line 7 (tl.store at line 4)"
    assert access.notes == ()  # `offs`, which the helper adds to its pointer, carries none of ours


def test_a_helper_summary_says_what_it_writes_and_returns():
    row = analyze(helper_source(HELPERS["_row"], "_row"))
    assert set(row.returns) == {("base", "")} and set(row.writes) == set()
    tile = analyze(helper_source(HELPERS["_store_tile"], "_store_tile"))
    assert set(tile.writes) == {"ptr", "offs"}  # `ptr + offs`: either may be the pointer; the call site tells


def test_recursion_through_helpers_is_undecided_not_endless():
    HELPERS["_loop"] = '''
def _loop(p, n):
    if n > 0:
        _loop(p, n - 1)
'''
    try:
        access = analyze(helper_source("def k(x_ptr):\n    _loop(x_ptr, 3)\n"))
    finally:
        del HELPERS["_loop"]
    assert set(access.undecided) == {"x_ptr"} and "recursive" in access.undecided["x_ptr"]


def test_a_function_passed_as_a_constexpr_cannot_be_followed():
    source = '''
    def apply_kernel(x_ptr, out_ptr, n, FN: tl.constexpr, BLOCK: tl.constexpr):
        offs = tl.arange(0, BLOCK)
        FN(x_ptr + offs, out_ptr + offs, offs < n)
    '''
    access = analyze(source)
    exact(access, reads={"n"}, undecided={"x_ptr", "out_ptr"}, constexprs={"FN", "BLOCK"})
    assert "`FN`, a function given as an argument" in access.undecided["x_ptr"]


# --- what cannot be decided -----------------------------------------------------------------

def test_inline_asm_with_a_pointer_is_undecided_with_values_it_is_not():
    source = '''
    def k(x_ptr, y_ptr, out_ptr, BLOCK: tl.constexpr):
        offs = tl.arange(0, BLOCK)
        x = tl.load(x_ptr + offs)
        y = tl.inline_asm_elementwise("shl.b32 $0, $1, 3;", "=r,r", [x], dtype=tl.int32, is_pure=True, pack=1)
        tl.inline_asm_elementwise("st.global.b32 [$1], $2;", "=r,l,r", [y_ptr + offs, y], dtype=tl.int32,
                                  is_pure=False, pack=1)
        tl.store(out_ptr + offs, y)
    '''
    access = analyze(source)
    exact(access, writes={"out_ptr"}, reads={"x_ptr"}, undecided={"y_ptr"}, constexprs={"BLOCK"})
    assert "tl.inline_asm_elementwise" in access.undecided["y_ptr"]


def test_pointers_in_a_tuple_parameter_are_undecided_when_one_is_stored_to():
    source = '''
    def k(ptrs, sizes, BLOCK: tl.constexpr):
        offs = tl.arange(0, BLOCK)
        x = tl.load(ptrs[0] + offs)
        tl.store(ptrs[1] + offs, x)
        for p in sizes:
            tl.device_print("size", p)
    '''
    access = analyze(source)
    exact(access, reads={"sizes"}, undecided={"ptrs"}, constexprs={"BLOCK"})
    assert "tuple parameter `ptrs`" in access.undecided["ptrs"]


def test_a_tuple_parameter_only_loaded_from_is_read():
    source = '''
    def k(ptrs, out_ptr):
        a, b = ptrs
        tl.store(out_ptr, tl.load(a) + tl.load(b))
    '''
    exact(analyze(source), writes={"out_ptr"}, reads={"ptrs"})


def test_a_store_through_a_pointer_loaded_from_memory_is_noted():
    source = '''
    def grouped_kernel(ptr_table, sizes_ptr, g):
        dst = tl.load(ptr_table + g).to(tl.pointer_type(tl.float32))
        tl.store(dst, tl.load(sizes_ptr + g).to(tl.float32))
    '''
    access = analyze(source)
    exact(access, reads={"ptr_table", "sizes_ptr", "g"})
    (note,) = access.notes
    assert note.startswith("line 4: tl.store through a pointer no parameter gives")


def test_an_unknown_tl_function_given_a_pointer_is_undecided():
    source = '''
    def k(x_ptr, out_ptr):
        tl.some_future_async_store(out_ptr, tl.load(x_ptr))
    '''
    access = analyze(source)
    exact(access, reads={"x_ptr"}, undecided={"out_ptr"})
    assert "tl.some_future_async_store, which the analysis does not know" in access.undecided["out_ptr"]


def test_a_statement_the_analysis_does_not_model_makes_every_parameter_undecided():
    source = '''
    def k(x_ptr, out_ptr, N: tl.constexpr):
        def inner(p):
            return p
        tl.store(out_ptr, tl.load(x_ptr))
    '''
    access = analyze(source)
    exact(access, writes={"out_ptr"}, undecided={"x_ptr"}, constexprs={"N"})
    assert "`FunctionDef` statement at line 3" in access.undecided["x_ptr"]


def test_source_that_does_not_parse_counts_every_argument_as_written():
    access = analyze("def k(x_ptr, :\n", name="broken")
    assert access.error.startswith("its source does not parse")
    assert access.access("x_ptr") == "w" and access.access("anything") == "w"
    assert access.assumed().startswith("Triton kernel `broken`: its source does not parse")


# --- where the source comes from --------------------------------------------------------------

def test_descriptors_and_their_store_method():
    source = '''
    def k(x_ptr, out_ptr, M, N, BM: tl.constexpr, BN: tl.constexpr):
        src = tl.make_tensor_descriptor(x_ptr, shape=[M, N], strides=[N, 1], block_shape=[BM, BN])
        dst = tl.make_tensor_descriptor(out_ptr, shape=[M, N], strides=[N, 1], block_shape=[BM, BN])
        dst.store([0, 0], src.load([0, 0]))
    '''
    exact(analyze(source), writes={"out_ptr"}, reads={"x_ptr", "M", "N"}, constexprs={"BM", "BN"})


def test_names_bound_to_triton_language_in_the_kernels_module():
    source = '''
    def k(x_ptr, out_ptr):
        put(out_ptr, lang.load(x_ptr))
    '''
    access = analyze(Source(textwrap.dedent(source), tl_aliases=frozenset({"lang"}), tl_imports={"put": "store"}))
    exact(access, writes={"out_ptr"}, reads={"x_ptr"})


def test_reasons_name_the_file_line_when_the_source_says_where_it_is():
    access = analyze(Source(VECTOR_ADD.lstrip("\n").split("\n", 1)[1], file="kernels.py", first_line=40))
    assert access.evidence["output_ptr"] == "tl.store at kernels.py:48"
