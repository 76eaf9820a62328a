/* tilebin.runtime._hot: the compiled twin of runtime/_launcher.py's Launcher (the launch hot path).
 *
 * CPython limited API (abi3, 3.10+); no CUDA or torch headers; linked to neither libcuda nor
 * libpython.  The driver entry points (cuLaunchKernel, cuLaunchKernelEx, cuCtxGetCurrent,
 * cuCtxSetCurrent) arrive as addresses from Python (cuGetProcAddress through cuda-python, or a
 * test's stubs).  What one call does, in order -- the same steps as the Python twin:
 *   1. read the runtime symbols the layout needs: tensor sizes / strides, int scalar parameters;
 *   2. pick the device: unchecked launchers, the first tensor's get_device(); bound ones, their own;
 *   3. bound launchers: read every data pointer (data_ptr() or __cuda_array_interface__) and have
 *      the twin check them (alignment, aliasing) unless they equal one of the last RECENT_PTRS sets checked;
 *   4. evaluate every launch's grid and scalar programs, range-check and pack every argument into
 *      per-call stack buffers (so calls are reentrant and thread-safe), TMA descriptors copied
 *      from a per-slot cache of the last RECENT_PTRS addresses (the twin encodes a new one);
 *   5. the device's functions (loaded by the twin, once per device) and the stream (torch's
 *      current stream, or the one given: converted by the twin unless it is an int);
 *   6. make the device's context current, launch each launch with the GIL released, restore.
 * Anything unusual (a non-int where an int is read, an overflow, a value out of range, a failed
 * attribute read) sends the whole call to the Python twin before anything is launched, so both
 * paths raise the same errors.  A failed launch is handed to the twin (retry, DeviceError).
 */
#ifndef Py_LIMITED_API /* CMake's Python_add_library(USE_SABI 3.10) defines it too */
#define Py_LIMITED_API 0x030A0000
#endif
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <stdint.h>
#include <string.h>
#define MAXP 32  /* parameters */
#define MAXS 32  /* symbol sources */
#define MAXL 4   /* launches */
#define MAXA 48  /* kernel arguments per launch */
#define MAXT 4   /* TMA descriptors per variant */
#define MAXD 16  /* devices */
#define MAXPROG 64
#define DESC 128
#define RECENT_PTRS 8 /* checked pointer sets, and descriptors per TMA slot by address (as the twin's _tma.RECENT) */
#define BAIL 2   /* "let the Python twin do this call" */

typedef int (*launch_fn)(void *, unsigned, unsigned, unsigned, unsigned, unsigned, unsigned, unsigned,
                         void *, void **, void **);
typedef int (*launch_ex_fn)(const void *, void *, void **, void **);
typedef int (*ctx_get_fn)(void **);
typedef int (*ctx_set_fn)(void *);

typedef struct { /* CUlaunchConfig */
    unsigned gx, gy, gz, bx, by, bz, smem;
    void *stream;
    void *attrs;
    unsigned nattrs;
} LaunchConfig;

enum { OP_CONST, OP_SYM, OP_ADD, OP_SUB, OP_MUL, OP_FLOORDIV, OP_FLOORMOD, OP_TRUNCDIV, OP_TRUNCMOD,
       OP_MIN, OP_MAX, OP_NEG };
enum { SRC_SHAPE, SRC_STRIDE, SRC_SCALAR };
enum { ARG_PTR, ARG_PROG, ARG_DIRECT, ARG_CONST, ARG_TMA };
enum { T_I8, T_I16, T_I32, T_I64, T_U8, T_U16, T_U32, T_U64, T_F32, T_F64, T_F16, T_BF16, T_BOOL };

typedef struct { int n; int64_t code[MAXPROG]; } Prog;
typedef struct { int kind, a, b; Prog prog; uint64_t raw; } Arg;
typedef struct {
    Prog grid[3];
    unsigned block[3], smem;
    int nargs;
    Arg args[MAXA];
    int nattrs;
    unsigned char attrs[8 * 72]; /* CUlaunchAttribute[], 72 bytes each */
} Launch;
typedef struct { long ordinal; void *ctx; void *fn[MAXL]; } Device;
typedef struct { uint64_t ptr; int valid; unsigned char desc[DESC]; } TmaCache;

typedef struct {
    PyObject_HEAD
    PyObject *twin, *stream_getter; /* stream_getter: torch's raw current-stream call, or None */
    int nparams, nsrc, nlaunch, first, bound, ntensors, ntma;
    int src[MAXS][3];
    int tensors[MAXP];
    Launch launch[MAXL];
    int ndev;
    Device dev[MAXD];
    uint64_t ok_ptrs[RECENT_PTRS][MAXP]; /* pointer sets that passed the twin's check (depends on nothing else) */
    int ok_count, ok_next;
    TmaCache tma[MAXT][RECENT_PTRS]; /* geometry is fixed per bound launcher: the address is the key */
    int tma_next[MAXT];
    launch_fn cu_launch;
    launch_ex_fn cu_launch_ex;
    ctx_get_fn ctx_get;
    ctx_set_fn ctx_set;
} Core;

static PyObject *s_shape, *s_stride, *s_data_ptr, *s_cai, *s_data, *s_get_device;
static PyObject *s_call, *s_run, *s_device, *s_failed, *s_tma, *s_check, *s_stream;

/* ------------------------------------------------------------------ construction helpers */
static int as_int(PyObject *seq, Py_ssize_t i, long long *out) {
    PyObject *o = PyTuple_GetItem(seq, i);
    if (!o) return -1;
    *out = PyLong_AsLongLong(o);
    return (*out == -1 && PyErr_Occurred()) ? -1 : 0;
}

#include "_hot_tensor.h"

static int parse_prog(PyObject *t, Prog *p) {
    if (!PyTuple_Check(t) || PyTuple_Size(t) > MAXPROG) {
        PyErr_SetString(PyExc_ValueError, "program: expected a tuple of at most 64 ints");
        return -1;
    }
    p->n = (int)PyTuple_Size(t);
    for (int i = 0; i < p->n; i++) {
        long long v;
        if (as_int(t, i, &v)) return -1;
        p->code[i] = v;
    }
    return 0;
}

static int parse_arg(PyObject *t, Arg *a) {
    long long kind, x, y;
    if (!PyTuple_Check(t) || PyTuple_Size(t) != 3 || as_int(t, 0, &kind) || as_int(t, 1, &x)) {
        if (!PyErr_Occurred()) PyErr_SetString(PyExc_ValueError, "argument slot: expected (kind, a, b)");
        return -1;
    }
    a->kind = (int)kind;
    a->a = (int)x;
    PyObject *b = PyTuple_GetItem(t, 2);
    if (kind == ARG_PROG) return parse_prog(b, &a->prog);
    if (kind == ARG_CONST) {
        a->raw = PyLong_AsUnsignedLongLong(b);
        return PyErr_Occurred() ? -1 : 0;
    }
    if (as_int(t, 2, &y)) return -1;
    a->b = (int)y;
    return 0;
}

/* (grid programs (3), block (3), smem, args, attrs bytes) */
static int parse_launch(PyObject *t, Launch *ln) {
    PyObject *grid, *block, *args, *attrs;
    long long smem;
    if (!PyTuple_Check(t) || PyTuple_Size(t) != 5) {
        PyErr_SetString(PyExc_ValueError, "launch: expected (grid, block, smem, args, attrs)");
        return -1;
    }
    grid = PyTuple_GetItem(t, 0), block = PyTuple_GetItem(t, 1), args = PyTuple_GetItem(t, 3);
    attrs = PyTuple_GetItem(t, 4);
    if (!PyTuple_Check(grid) || PyTuple_Size(grid) != 3 || !PyTuple_Check(block) || PyTuple_Size(block) != 3) {
        PyErr_SetString(PyExc_ValueError, "launch: grid and block must be 3-tuples");
        return -1;
    }
    if (as_int(t, 2, &smem)) return -1;
    ln->smem = (unsigned)smem;
    for (int d = 0; d < 3; d++) {
        long long b;
        if (parse_prog(PyTuple_GetItem(grid, d), &ln->grid[d]) || as_int(block, d, &b)) return -1;
        ln->block[d] = (unsigned)b;
    }
    if (!PyTuple_Check(args) || PyTuple_Size(args) > MAXA) {
        PyErr_SetString(PyExc_ValueError, "launch: too many kernel arguments for the compiled path");
        return -1;
    }
    ln->nargs = (int)PyTuple_Size(args);
    for (int j = 0; j < ln->nargs; j++)
        if (parse_arg(PyTuple_GetItem(args, j), &ln->args[j])) return -1;
    char *buf;
    Py_ssize_t n;
    if (PyBytes_AsStringAndSize(attrs, &buf, &n)) return -1;
    if (n % 72 || n > (Py_ssize_t)sizeof(ln->attrs)) {
        PyErr_SetString(PyExc_ValueError, "launch: attributes must be whole 72-byte CUlaunchAttributes");
        return -1;
    }
    memcpy(ln->attrs, buf, (size_t)n);
    ln->nattrs = (int)(n / 72);
    return 0;
}

static int parse_entries(Core *c, PyObject *entries) {
    long long v[4];
    for (int i = 0; i < 4; i++)
        if (as_int(entries, i, &v[i])) return -1;
    if (!v[0] || !v[1] || !v[2] || !v[3]) {
        PyErr_SetString(PyExc_ValueError, "driver entry points must be non-null addresses");
        return -1;
    }
    c->cu_launch = (launch_fn)(intptr_t)v[0];
    c->cu_launch_ex = (launch_ex_fn)(intptr_t)v[1];
    c->ctx_get = (ctx_get_fn)(intptr_t)v[2];
    c->ctx_set = (ctx_set_fn)(intptr_t)v[3];
    return 0;
}

static int parse_table(PyObject *t, int limit, const char *what) {
    if (!PyTuple_Check(t) || PyTuple_Size(t) > limit) {
        PyErr_Format(PyExc_ValueError, "%s: expected a tuple of at most %d entries", what, limit);
        return -1;
    }
    return (int)PyTuple_Size(t);
}

/* A bound launcher's device: (ordinal, context, (function per launch, ...)). */
static int parse_fixed(Core *c, PyObject *fixed) {
    long long ordinal, ctx, fn;
    PyObject *fns = PyTuple_GetItem(fixed, 2);
    if (as_int(fixed, 0, &ordinal) || as_int(fixed, 1, &ctx)) return -1;
    c->dev[0].ordinal = (long)ordinal, c->dev[0].ctx = (void *)(intptr_t)ctx;
    for (int i = 0; i < c->nlaunch; i++) {
        if (!fns || as_int(fns, i, &fn)) return -1;
        c->dev[0].fn[i] = (void *)(intptr_t)fn;
    }
    c->ndev = 1;
    return 0;
}

/* Core(twin, nparams, first, sources, tensors, launches, ntma, entries, stream_getter, fixed)
 * fixed: None (unchecked: device per call) or (ordinal, ctx, functions) of a bound launcher. */
static int core_init(PyObject *self, PyObject *args, PyObject *kw) {
    Core *c = (Core *)self;
    PyObject *twin, *sources, *tensors, *launches, *entries, *getter, *fixed;
    int nparams, first, ntma;
    if (!PyArg_ParseTuple(args, "OiiOOOiOOO", &twin, &nparams, &first, &sources, &tensors, &launches, &ntma,
                          &entries, &getter, &fixed))
        return -1;
    if (nparams > MAXP || ntma > MAXT || parse_entries(c, entries)) {
        if (!PyErr_Occurred()) PyErr_SetString(PyExc_ValueError, "too many parameters for the compiled path");
        return -1;
    }
    c->nparams = nparams, c->first = first, c->ntma = ntma;
    if ((c->nsrc = parse_table(sources, MAXS, "sources")) < 0) return -1;
    for (int i = 0; i < c->nsrc; i++)
        for (int k = 0; k < 3; k++) {
            long long v;
            if (as_int(PyTuple_GetItem(sources, i), k, &v)) return -1;
            c->src[i][k] = (int)v;
        }
    if ((c->ntensors = parse_table(tensors, MAXP, "tensors")) < 0) return -1;
    for (int i = 0; i < c->ntensors; i++) {
        long long v;
        if (as_int(tensors, i, &v)) return -1;
        c->tensors[i] = (int)v;
    }
    if ((c->nlaunch = parse_table(launches, MAXL, "launches")) < 0) return -1;
    for (int i = 0; i < c->nlaunch; i++)
        if (parse_launch(PyTuple_GetItem(launches, i), &c->launch[i])) return -1;
    c->bound = fixed != Py_None;
    if (c->bound && parse_fixed(c, fixed)) return -1;
    Py_INCREF(twin), Py_INCREF(getter);
    c->twin = twin, c->stream_getter = getter;
    return 0;
}

static void core_dealloc(PyObject *self) {
    Core *c = (Core *)self;
    PyTypeObject *tp = Py_TYPE(self);
    Py_XDECREF(c->twin);
    Py_XDECREF(c->stream_getter);
    freefunc f = (freefunc)PyType_GetSlot(tp, Py_tp_free);
    f(self);
    Py_DECREF(tp);
}

/* ------------------------------------------------------------------ per call */
#include "_hot_args.h"
#include "_hot_eval.h"
#include "_hot_call.h"
#include "_hot_dispatch.h"
#include "_hot_opkey.h"

static PyType_Slot core_slots[] = {
    {Py_tp_init, core_init},
    {Py_tp_dealloc, core_dealloc},
    {Py_tp_call, core_call},
    {Py_tp_methods, core_methods},
    {Py_tp_doc, "Launcher(twin, ...): the compiled hot path of one Launcher; build it through "
                "tilebin.runtime._launcher (never directly)."},
    {0, NULL},
};

static PyType_Spec core_spec = {"tilebin.runtime._hot.Launcher", sizeof(Core), 0, Py_TPFLAGS_DEFAULT, core_slots};

static int intern(PyObject **s, const char *text) {
    *s = PyUnicode_InternFromString(text);
    return *s ? 0 : -1;
}

static struct PyModuleDef module = {PyModuleDef_HEAD_INIT, "_hot", "tilebin's compiled launch hot path", -1, NULL,
                                    NULL, NULL, NULL, NULL};

PyMODINIT_FUNC PyInit__hot(void) {
    if (intern(&s_shape, "shape") || intern(&s_stride, "stride") || intern(&s_data_ptr, "data_ptr") ||
        intern(&s_cai, "__cuda_array_interface__") || intern(&s_data, "data") ||
        intern(&s_get_device, HOT_GET_DEVICE) || intern(&s_call, "_slow_call") || intern(&s_run, "_slow_run") ||
        intern(&s_device, "_device_state") || intern(&s_failed, "_launch_failed") ||
        intern(&s_tma, "_tma_address") || intern(&s_check, "_check_pointers") || intern(&s_stream, "_stream_of") ||
        intern(&s_dtype, "dtype") || intern(&s_size, "size") || intern(&s_devattr, "device") ||
        intern(&s_runattr, "run"))
        return NULL;
    PyObject *m = PyModule_Create(&module);
    PyObject *tp = m ? PyType_FromSpec(&core_spec) : NULL;
    PyObject *dp = tp ? PyType_FromSpec(&dispatch_spec) : NULL;
    PyObject *ok = dp ? PyType_FromSpec(&opkey_spec) : NULL;
    core_type = tp;
    Py_XINCREF(tp); /* core_type keeps its own reference */
    if (!ok || PyModule_AddObject(m, "Launcher", tp) || add_front(m, dp) || PyModule_AddObject(m, "Dispatch", dp) ||
        PyModule_AddFunctions(m, tensor_methods) || PyModule_AddObject(m, "OpKey", ok)) {
        Py_XDECREF(ok);
        Py_XDECREF(dp);
        Py_XDECREF(m);
        return NULL;
    }
    PyModule_AddIntConstant(m, "ABI", 2);
    return m;
}
