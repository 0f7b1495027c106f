"""Package-level checks that need neither a GPU nor PyTorch: import without torch, the ctypes
struct layout against the C header, library loading and the status -> exception mapping."""

import ast
import ctypes
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

PYTHON_DIR = Path(__file__).resolve().parent.parent
PACKAGE_DIR = PYTHON_DIR / "cinfer"
REPO_DIR = PYTHON_DIR.parent


def _module_level_imports(tree: ast.Module):
    """Import statements executed at import time: module level and inside module-level if/try
    blocks, except ``if TYPE_CHECKING:``."""
    todo = list(tree.body)
    while todo:
        node = todo.pop()
        if isinstance(node, (ast.Import, ast.ImportFrom)):
            yield node
        elif isinstance(node, ast.If):
            test = node.test
            if isinstance(test, ast.Name) and test.id == "TYPE_CHECKING":
                todo.extend(node.orelse)
                continue
            todo.extend(node.body + node.orelse)
        elif isinstance(node, ast.Try):
            todo.extend(node.body + node.orelse + node.finalbody)
            for h in node.handlers:
                todo.extend(h.body)


# torch_ops is the one module that imports torch: it is imported only when torch already is (or
# by the user); test_import_without_torch_and_without_library checks the package never needs it.
@pytest.mark.parametrize("path", sorted(p for p in PACKAGE_DIR.glob("*.py")
                                       if p.name != "torch_ops.py"), ids=lambda p: p.name)
def test_no_top_level_torch_import(path):
    tree = ast.parse(path.read_text(), str(path))
    for node in _module_level_imports(tree):
        names = ([a.name for a in node.names] if isinstance(node, ast.Import)
                 else [node.module or ""])
        for name in names:
            assert name.split(".")[0] != "torch", (
                f"{path.name}:{node.lineno} imports torch at import time"
            )


def test_import_without_torch_and_without_library(tmp_path):
    # sys.modules["torch"] = None makes any `import torch` fail; a bogus CINFER_LIBRARY proves the
    # library is not loaded at import either.
    code = (
        "import sys; sys.modules['torch'] = None\n"
        "import cinfer\n"
        "assert callable(cinfer.single_decode_with_kv_cache)\n"
        "assert callable(cinfer.single_prefill_with_kv_cache)\n"
        "assert callable(cinfer.apply_rope_with_cos_sin_cache_inplace)\n"
        "assert 'cinfer.torch_ops' not in sys.modules\n"
        "assert cinfer.BatchDecodeWithPagedKVCacheWrapper.run_return_lse\n"
        "try:\n"
        "    cinfer.merge_state(None, None, None, None)\n"
        "except ImportError as e:\n"
        "    assert 'torch' in str(e)\n"
        "else:\n"
        "    raise AssertionError('expected ImportError')\n"
        "for cls in (cinfer.BatchDecodeWithPagedKVCacheWrapper,\n"
        "            cinfer.BatchPrefillWithPagedKVCacheWrapper,\n"
        "            cinfer.BatchPrefillWithRaggedKVCacheWrapper,\n"
        "            cinfer.BatchMLAPagedAttentionWrapper):\n"
        "    try:\n"
        "        cls(None)\n"
        "    except ImportError as e:\n"
        "        assert 'install torch' in str(e), (cls.__name__, str(e))\n"
        "    else:\n"
        "        raise AssertionError('expected ImportError from ' + cls.__name__)\n"
        "try:\n"
        "    import cinfer.torch_ops\n"
        "except ImportError as e:\n"
        "    assert 'install torch' in str(e), str(e)\n"
        "else:\n"
        "    raise AssertionError('expected ImportError from cinfer.torch_ops')\n"
        "import types\n"
        "public = {n for n in dir(cinfer) if not n.startswith('_')\n"
        "          and not isinstance(getattr(cinfer, n), types.ModuleType)}\n"
        "extra = public - set(cinfer.__all__)\n"
        "assert not extra, sorted(extra)\n"
        "assert set(cinfer.__all__) <= set(dir(cinfer)), set(cinfer.__all__) - set(dir(cinfer))\n"
        "print('ok')\n"
    )
    env = dict(os.environ, PYTHONPATH=str(PYTHON_DIR),
               CINFER_LIBRARY=str(tmp_path / "missing.so"))
    r = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True)
    assert r.returncode == 0, r.stderr
    assert r.stdout.strip() == "ok"


def _probe_compile(tmp_path):
    """Compiles a C program printing the layout the header gives; None if it cannot be built."""
    cc = shutil.which(os.environ.get("CC", "cc")) or shutil.which("gcc")
    if not cc:
        return None
    includes = [REPO_DIR / "include", REPO_DIR / ".deps" / "include"]
    for var in ("CUDA_HOME", "CUDA_PATH"):
        if os.environ.get(var):
            includes.append(Path(os.environ[var]) / "include")
    includes += [Path("/usr/local/cuda/include"), Path("/usr/include")]
    src = tmp_path / "probe.c"
    src.write_text(r"""
#include <stddef.h>
#include <stdio.h>
#include <cinfer.h>
#define S(name, T) printf("%s %zu\n", name, sizeof(T))
#define O(name, T, f) printf("%s %zu\n", name, offsetof(T, f))
int main(void) {
    S("DLDevice", DLDevice);
    S("DLDataType", DLDataType);
    S("DLTensor", DLTensor);
    O("DLTensor.shape", DLTensor, shape);
    O("DLTensor.byte_offset", DLTensor, byte_offset);
    S("cinfer_context_options_t", cinfer_context_options_t);
    S("cinfer_attention_options_t", cinfer_attention_options_t);
    O("cinfer_attention_options_t.kv_layout", cinfer_attention_options_t, kv_layout);
    O("cinfer_attention_options_t.q_dtype", cinfer_attention_options_t, q_dtype);
    O("cinfer_attention_options_t.sm_scale", cinfer_attention_options_t, sm_scale);
    O("cinfer_attention_options_t.k_scale", cinfer_attention_options_t, k_scale);
    O("cinfer_attention_options_t.max_batch_size", cinfer_attention_options_t, max_batch_size);
    O("cinfer_attention_options_t.use_tensor_cores", cinfer_attention_options_t, use_tensor_cores);
    O("cinfer_attention_options_t.variant", cinfer_attention_options_t, variant);
    O("cinfer_attention_options_t.pos_encoding_mode", cinfer_attention_options_t,
      pos_encoding_mode);
    O("cinfer_attention_options_t.rope_theta", cinfer_attention_options_t, rope_theta);
    S("cinfer_jit_stats_t", cinfer_jit_stats_t);
    S("cinfer_mla_options_t", cinfer_mla_options_t);
    O("cinfer_mla_options_t.q_dtype", cinfer_mla_options_t, q_dtype);
    O("cinfer_mla_options_t.sm_scale", cinfer_mla_options_t, sm_scale);
    O("cinfer_mla_options_t.max_batch_size", cinfer_mla_options_t, max_batch_size);
    S("cinfer_append_options_t", cinfer_append_options_t);
    O("cinfer_append_options_t.kv_layout", cinfer_append_options_t, kv_layout);
    O("cinfer_append_options_t.k_scale", cinfer_append_options_t, k_scale);
    S("cinfer_rope_options_t", cinfer_rope_options_t);
    O("cinfer_rope_options_t.rotary_dim", cinfer_rope_options_t, rotary_dim);
    O("cinfer_rope_options_t.rope_scale", cinfer_rope_options_t, rope_scale);
    O("cinfer_rope_options_t.old_context_len", cinfer_rope_options_t, old_context_len);
    S("cinfer_param_t", cinfer_param_t);
    O("cinfer_param_t.kind", cinfer_param_t, kind);
    O("cinfer_param_t.dtype", cinfer_param_t, dtype);
    S("cinfer_arg_t", cinfer_arg_t);
    O("cinfer_arg_t.tensor", cinfer_arg_t, tensor);
    O("cinfer_arg_t.dtype", cinfer_arg_t, dtype);
    O("cinfer_arg_t.value", cinfer_arg_t, value);
    S("cinfer_args_t", cinfer_args_t);
    O("cinfer_args_t.args", cinfer_args_t, args);
    printf("KV_STORAGE %d %d\n", (int)CINFER_KV_STORAGE_RAGGED, (int)CINFER_KV_STORAGE_PAGED);
    printf("PARAM_KIND %d %d\n", (int)CINFER_PARAM_TENSOR, (int)CINFER_PARAM_SCALAR);
    cinfer_arg_t f = CINFER_ARG_F32(0.5f);
    printf("ARG_F32 %d %d %d %d\n", (int)f.kind, f.dtype.code, f.dtype.bits, f.dtype.lanes);
    cinfer_arg_t u = CINFER_ARG_U32(7u);
    printf("ARG_U32 %d %d %d %d\n", (int)u.kind, u.dtype.code, u.dtype.bits, u.dtype.lanes);
    printf("ATTENTION_OPTIONS_VERSION %d\n", CINFER_ATTENTION_OPTIONS_VERSION);
    printf("CONTEXT_OPTIONS_VERSION %d\n", CINFER_CONTEXT_OPTIONS_VERSION);
    printf("JIT_STATS_VERSION %d\n", CINFER_JIT_STATS_VERSION);
    printf("APPEND_OPTIONS_VERSION %d\n", CINFER_APPEND_OPTIONS_VERSION);
    printf("ROPE_OPTIONS_VERSION %d\n", CINFER_ROPE_OPTIONS_VERSION);
    printf("MLA_OPTIONS_VERSION %d\n", CINFER_MLA_OPTIONS_VERSION);
    cinfer_mla_options_t m = CINFER_MLA_OPTIONS_INIT;
    printf("MLA_INIT %d %d %d %d %d %d\n", m.head_dim_ckv, m.head_dim_kpe, m.page_size,
           m.q_dtype.code, m.use_cuda_graph, m.max_batch_size);
    cinfer_attention_options_t ao = CINFER_ATTENTION_OPTIONS_INIT;
    printf("ATTENTION_ROPE_INIT %d %d %d %d\n", (int)ao.pos_encoding_mode, (int)ao.rope_scale,
           (int)ao.rope_theta, (int)CINFER_POS_ENCODING_ROPE_LLAMA);
    cinfer_append_options_t a = CINFER_APPEND_OPTIONS_INIT;
    printf("APPEND_INIT %d %d %d\n", (int)a.kv_layout, a.page_size, (int)(a.k_scale * a.v_scale));
    cinfer_rope_options_t r = CINFER_ROPE_OPTIONS_INIT;
    printf("ROPE_INIT %d %d %d %d %d %d %d\n", r.rotary_dim, r.interleave, (int)r.rope_scale,
           (int)r.rope_theta, (int)r.low_freq_factor, (int)r.high_freq_factor,
           (int)r.old_context_len);
    cinfer_rope_options_t l = CINFER_LLAMA31_ROPE_OPTIONS_INIT;
    printf("LLAMA31_INIT %d %d %d %d %d %d %d\n", l.rotary_dim, l.interleave, (int)l.rope_scale,
           (int)l.rope_theta, (int)l.low_freq_factor, (int)l.high_freq_factor,
           (int)l.old_context_len);
    return 0;
}
""")
    exe = tmp_path / "probe"
    cmd = [cc, "-std=c11", str(src), "-o", str(exe)]
    cmd += [f"-I{p}" for p in includes if p.is_dir()]
    if subprocess.run(cmd, capture_output=True).returncode != 0:
        return None
    out = subprocess.run([str(exe)], capture_output=True, text=True, check=True).stdout
    return {k: [int(x) for x in rest] if len(rest) > 1 else int(rest[0])
            for k, *rest in (line.split() for line in out.splitlines())}


def test_struct_layout_matches_header(tmp_path):
    from cinfer import _lib

    if ctypes.sizeof(ctypes.c_void_p) != 8:
        pytest.skip("the recorded layout is LP64's")
    assert _lib._layout_of_ctypes() == _lib.LAYOUT
    probe = _probe_compile(tmp_path)
    if probe is None:
        pytest.skip("cannot compile a probe against include/cinfer.h (no compiler or headers)")
    assert {k: probe[k] for k in _lib.LAYOUT} == _lib.LAYOUT
    assert probe["ATTENTION_OPTIONS_VERSION"] == _lib.ATTENTION_OPTIONS_VERSION
    assert probe["CONTEXT_OPTIONS_VERSION"] == _lib.CONTEXT_OPTIONS_VERSION
    assert probe["JIT_STATS_VERSION"] == _lib.JIT_STATS_VERSION
    assert probe["APPEND_OPTIONS_VERSION"] == _lib.APPEND_OPTIONS_VERSION
    assert probe["ROPE_OPTIONS_VERSION"] == _lib.ROPE_OPTIONS_VERSION
    assert probe["MLA_OPTIONS_VERSION"] == _lib.MLA_OPTIONS_VERSION
    m = _lib.mla_options()
    assert probe["MLA_INIT"] == [m.head_dim_ckv, m.head_dim_kpe, m.page_size, m.q_dtype.code,
                                 m.use_cuda_graph, m.max_batch_size]
    o = _lib.attention_options()
    assert probe["ATTENTION_ROPE_INIT"] == [o.pos_encoding_mode, int(o.rope_scale),
                                            int(o.rope_theta), _lib.POS_ENCODING_ROPE_LLAMA]
    assert probe["KV_STORAGE"] == [_lib.KV_STORAGE_RAGGED, _lib.KV_STORAGE_PAGED]
    assert probe["PARAM_KIND"] == [_lib.PARAM_TENSOR, _lib.PARAM_SCALAR]
    assert probe["ARG_F32"] == [_lib.PARAM_SCALAR, _lib.KDL_FLOAT, 32, 1]
    assert probe["ARG_U32"] == [_lib.PARAM_SCALAR, _lib.KDL_UINT, 32, 1]
    # The Python defaults are the _INIT macros'.
    a = _lib.append_options()
    assert probe["APPEND_INIT"] == [a.kv_layout, a.page_size, int(a.k_scale * a.v_scale)]
    for key, llama31 in (("ROPE_INIT", False), ("LLAMA31_INIT", True)):
        r = _lib.rope_options(llama31)
        assert probe[key] == [r.rotary_dim, r.interleave, int(r.rope_scale), int(r.rope_theta),
                              int(r.low_freq_factor), int(r.high_freq_factor),
                              int(r.old_context_len)], key


def test_attention_options_defaults_match_init_macro():
    from cinfer import _lib

    o = _lib.attention_options()
    assert o.size == 96 and o.version == 4 and o.variant is None and o.head_dim_vo == 0
    assert (o.pos_encoding_mode, o.rope_scale, o.rope_theta) == (0, 1.0, 1e4)
    assert (o.page_size, o.kv_layout, o.window_left, o.max_batch_size) == (16, 0, -1, 1)
    assert (o.q_dtype.code, o.q_dtype.bits, o.q_dtype.lanes) == (_lib.KDL_BFLOAT, 16, 1)
    assert (o.k_scale, o.v_scale, o.sm_scale, o.logits_soft_cap) == (1.0, 1.0, 0.0, 0.0)


def test_status_mapping():
    import cinfer
    from cinfer import errors

    cases = {
        errors.INVALID_ARGUMENT: cinfer.ArgumentError,
        errors.PLAN_MISMATCH: cinfer.ArgumentError,
        errors.WORKSPACE_TOO_SMALL: cinfer.ArgumentError,
        errors.UNSUPPORTED: cinfer.UnsupportedError,
        errors.COMPILE_ERROR: cinfer.CompileError,
        errors.NO_DEVICE: cinfer.NoDeviceError,
        errors.CUDA_ERROR: cinfer.CinferError,
        errors.OUT_OF_MEMORY: cinfer.CinferError,
        errors.NOT_FOUND: cinfer.CinferError,
        errors.IO_ERROR: cinfer.CinferError,
        errors.INTERNAL: cinfer.CinferError,
    }
    for status, cls in cases.items():
        e = errors.error_for_status(status, "the message", "fn")
        assert type(e) is cls
        assert e.status == status and e.message == "the message"
        assert "fn: the message" in str(e) and errors.STATUS_NAMES[status] in str(e)
    assert issubclass(cinfer.UnsupportedError, ValueError)
    assert issubclass(cinfer.ArgumentError, ValueError)
    for cls in (cinfer.CompileError, cinfer.NoDeviceError, cinfer.CinferError):
        assert issubclass(cls, RuntimeError)


def _library_or_skip():
    from cinfer import _lib, errors

    try:
        return _lib.lib()
    except errors.CinferError as e:
        pytest.skip(f"libcinfer.so not available: {e}")


def test_library_loads_and_reports_errors():
    import cinfer
    from cinfer import _lib

    lib = _library_or_skip()
    assert cinfer.library_version().startswith("0.")
    # The status strings agree with the Python table.
    from cinfer import errors

    for status, name in errors.STATUS_NAMES.items():
        assert lib.cinfer_status_name(status).decode() == f"CINFER_STATUS_{name}"
    # A NULL context is rejected with the library's message, as ValueError.
    opts = _lib.attention_options(num_qo_heads=8, num_kv_heads=1, head_dim=128)
    nbytes = ctypes.c_size_t()
    with pytest.raises(ValueError, match="ctx is NULL"):
        _lib.check(lib.cinfer_batch_decode_workspace_size(None, ctypes.byref(opts),
                                                          ctypes.byref(nbytes)), "ws")
    stats = cinfer.jit_stats()
    assert set(stats) >= {"compiles", "memory_hits", "compile_seconds"}


def test_explicit_library_path_must_exist(monkeypatch, tmp_path):
    from cinfer import _lib, errors

    monkeypatch.setenv("CINFER_LIBRARY", str(tmp_path / "nope.so"))
    with pytest.raises(errors.CinferError, match="CINFER_LIBRARY"):
        _lib.library_path()
    monkeypatch.delenv("CINFER_LIBRARY")
    paths = _lib.candidate_paths()
    assert paths[0] == PACKAGE_DIR / "libcinfer.so"
    assert paths[1] == REPO_DIR / "build" / "libcinfer.so"


def test_a_library_that_is_not_cinfer_is_named_as_such():
    # The C library this process has mapped stands in for another library.
    maps = Path("/proc/self/maps")
    paths = maps.read_text().split() if maps.exists() else []
    other = next((p for p in paths if "/libc.so" in p or "/libc-" in p), None)
    if not other:
        pytest.skip("no path to the C library (no /proc/self/maps)")
    code = (
        "from cinfer import _lib, errors\n"
        "try:\n"
        "    _lib.lib()\n"
        "except errors.CinferError as e:\n"
        "    print(e)\n"
    )
    env = dict(os.environ, PYTHONPATH=str(PYTHON_DIR), CINFER_LIBRARY=other)
    r = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True)
    assert r.returncode == 0, r.stderr
    assert "is not a cinfer library (it has no symbol cinfer_version)" in r.stdout, r.stdout
