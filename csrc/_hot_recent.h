/* _hot.c, part 4a: a Dispatch's recent signatures -- runtime.launch's plan-cache hit compared as C values.
 *
 * A Dispatch remembers the last RECENT signatures it found in its plan cache, each as plain values:
 * per tensor its dtype (identity), sizes (shape), strides and CUDA ordinal (is_cuda and get_device(), or 0
 * without the call when the driver sees one device); per
 * keyed scalar its exact type and int value; per pass-through scalar its type.  A call whose values
 * equal one of them runs that plan without building, hashing or comparing a key tuple.  Equal values
 * mean an equal fast key (runtime/_signature.py: dtype, size(), stride(), device per tensor), so both
 * find the same plan.  Anything these values cannot hold (a float keyed scalar, a non-CUDA tensor,
 * more than RT tensors or RD dims) is simply not remembered: the key path serves the call.
 */

#define RECENT 16 /* signatures per Dispatch */
#define RT 8      /* tensors */
#define RD 8      /* dims per tensor */
#define RS 8      /* scalars */
#ifndef HOT_IS_CUDA /* CPU benchmarks of this path build with -DHOT_IS_CUDA='"is_cpu"' (torch CPU tensors) */
#define HOT_IS_CUDA "is_cuda"
#endif
#ifndef HOT_GET_DEVICE /* ... and -DHOT_GET_DEVICE='"storage_offset"' (0 for a fresh CPU tensor) */
#define HOT_GET_DEVICE "get_device"
#endif

typedef struct {
    PyObject *dtype;
    int ndim;
    long dev;
    int64_t size[RD], stride[RD];
} TensorSig;

typedef struct {
    TensorSig t[RT];
    PyObject *ktype[RS], *dtype[RS]; /* keyed scalars' and pass-through scalars' exact types */
    int64_t kval[RS];
} Sig;

typedef struct {
    PyObject *plan; /* NULL: an empty entry */
    Sig sig;
} Recent;

static PyObject *s_is_cuda;
/* 1 when the driver sees exactly one CUDA device (set by the registry through _hot.single_device once
 * the driver is open; the count is fixed for the process): a CUDA tensor's ordinal is then 0. */
static int one_device;

/* A tuple of at most RD exact ints (x.shape, or x.stride() when `call`) into `out`; 0, or BAIL (error cleared). */
static int read_ints(PyObject *x, PyObject *name, int call, int64_t *out, int *n) {
    PyObject *r = call ? PyObject_CallMethodObjArgs(x, name, NULL) : PyObject_GetAttr(x, name);
    int rc = (r == NULL || !PyTuple_Check(r) || PyTuple_Size(r) > RD) ? BAIL : 0;
    if (rc == 0) *n = (int)PyTuple_Size(r);
    for (int i = 0; rc == 0 && i < *n; i++) rc = ll_of(PyTuple_GetItem(r, i), &out[i]);
    Py_XDECREF(r);
    PyErr_Clear();
    return rc;
}

/* One tensor's values; its dtype is held (a new reference) in t->dtype until sig_release. */
/* A torch.Tensor's values through torch's C shim (_hot_tensor.h), the same as read_tensor_sig's accessors
 * give: 0, BAIL (not a CUDA tensor), or 1 (read it through the accessors). */
static int shim_tensor_sig(void *h, TensorSig *t) {
    TensorRead v;
    PyObject *dtype;
    t->dtype = NULL;
    if (tabi_read(h, &v) || v.ndim > RD || (dtype = tabi_dtype(v.code)) == NULL) return 1;
    if (v.ordinal < 0) return BAIL; /* is_cuda False */
    t->dtype = dtype;
    t->ndim = (int)v.ndim;
    memcpy(t->size, v.sizes, sizeof(int64_t) * (size_t)v.ndim);
    memcpy(t->stride, v.strides, sizeof(int64_t) * (size_t)v.ndim);
    t->dev = one_device ? 0 : v.ordinal;
    Py_INCREF(t->dtype); /* held until sig_release, as the accessor's new reference */
    return 0;
}

static int read_tensor_sig(PyObject *x, TensorSig *t) {
    int64_t dev = -1;
    int nstride = -1;
    void *h = tensor_handle(x);
    int rc = h ? shim_tensor_sig(h, t) : 1;
    if (rc != 1) return rc;
    PyObject *cuda = PyObject_GetAttr(x, s_is_cuda);
    rc = cuda == Py_True ? 0 : BAIL; /* the ordinal below names a CUDA device only when is_cuda */
    Py_XDECREF(cuda);
    if (rc || (t->dtype = PyObject_GetAttr(x, s_dtype)) == NULL) {
        PyErr_Clear();
        return BAIL;
    }
    if (read_ints(x, s_shape, 0, t->size, &t->ndim) || read_ints(x, s_stride, 1, t->stride, &nstride) ||
        nstride != t->ndim)
        return BAIL;
    if (one_device) { /* the driver sees one device: every CUDA tensor is on ordinal 0 (no get_device() call) */
        t->dev = 0;
        return 0;
    }
    PyObject *r = PyObject_CallMethodObjArgs(x, s_get_device, NULL);
    rc = r == NULL ? BAIL : ll_of(r, &dev);
    Py_XDECREF(r);
    PyErr_Clear();
    t->dev = (long)dev;
    return rc;
}

/* Which arguments a signature reads (runtime/_registry.py KernelEntry: tensor_pos, keyed_pos, direct_pos). */
typedef struct {
    int nparams, nt, nk, nd;
    int t[MAXP], k[MAXP], d[MAXP];
} Positions;

static void sig_release(Sig *s, int nt) {
    for (int i = 0; i < nt; i++) Py_CLEAR(s->t[i].dtype);
}

/* This call's signature values (a: its nparams arguments); 0, or BAIL when they do not fit (s holds no
 * references then). */
static int read_sig(const Positions *p, PyObject *cls, PyObject *const *a, Sig *s) {
    int rc = p->nt > RT || p->nk > RS || p->nd > RS ? BAIL : 0;
    for (int i = 0; rc == 0 && i < p->nt; i++) {
        PyObject *x = a[p->t[i]];
        s->t[i].dtype = NULL;
        rc = (PyObject *)Py_TYPE(x) != cls ? BAIL : read_tensor_sig(x, &s->t[i]);
        if (rc) sig_release(s, i + 1);
    }
    for (int i = 0; rc == 0 && i < p->nk; i++) {
        PyObject *v = a[p->k[i]];
        s->ktype[i] = (PyObject *)Py_TYPE(v);
        rc = PyLong_CheckExact(v) || PyBool_Check(v) ? scalar_of(v, &s->kval[i]) : BAIL; /* floats: the key path */
        if (rc) sig_release(s, p->nt);
    }
    for (int i = 0; rc == 0 && i < p->nd; i++) s->dtype[i] = (PyObject *)Py_TYPE(a[p->d[i]]);
    return rc;
}

static int sig_equal(const Positions *p, const Sig *x, const Sig *y) {
    for (int i = 0; i < p->nt; i++) {
        const TensorSig *a = &x->t[i], *b = &y->t[i];
        size_t n = sizeof(int64_t) * (size_t)a->ndim;
        if (a->dtype != b->dtype || a->ndim != b->ndim || a->dev != b->dev || memcmp(a->size, b->size, n) ||
            memcmp(a->stride, b->stride, n))
            return 0;
    }
    for (int i = 0; i < p->nk; i++)
        if (x->ktype[i] != y->ktype[i] || x->kval[i] != y->kval[i]) return 0;
    for (int i = 0; i < p->nd; i++)
        if (x->dtype[i] != y->dtype[i]) return 0;
    return 1;
}

/* The remembered plan for `s` (a new reference), or NULL. */
static PyObject *recent_find(Recent *ring, const Positions *p, const Sig *s) {
    for (int r = 0; r < RECENT; r++)
        if (ring[r].plan && sig_equal(p, &ring[r].sig, s)) {
            Py_INCREF(ring[r].plan);
            return ring[r].plan;
        }
    return NULL;
}

static void recent_clear(Recent *e, const Positions *p) {
    PyObject *plan = e->plan;
    if (plan == NULL) return;
    e->plan = NULL;
    for (int i = 0; i < p->nk; i++) Py_DECREF(e->sig.ktype[i]);
    for (int i = 0; i < p->nd; i++) Py_DECREF(e->sig.dtype[i]);
    sig_release(&e->sig, p->nt);
    Py_DECREF(plan); /* last: a plan's destructor may run Python code, which finds this entry empty */
}

/* Remember `plan` for `s` in entry `slot` (its references are copied and taken). */
static void recent_add(Recent *e, const Positions *p, const Sig *s, PyObject *plan) {
    while (e->plan) /* a plan's destructor may let another thread fill this entry: empty it again */
        recent_clear(e, p);
    e->sig = *s; /* from here on no Python code runs: the entry is filled atomically under the GIL */
    for (int i = 0; i < p->nt; i++) Py_INCREF(e->sig.t[i].dtype);
    for (int i = 0; i < p->nk; i++) Py_INCREF(e->sig.ktype[i]);
    for (int i = 0; i < p->nd; i++) Py_INCREF(e->sig.dtype[i]);
    Py_INCREF(plan);
    e->plan = plan;
}
