/* _hot.c, part 2a: one call's arguments -- the Call state, sizes, strides, scalars and data pointers
 * (an exact torch.Tensor through torch's C shim when it is on: _hot_tensor.h; anything else through
 * its Python attributes). */
typedef struct {
    PyObject *const *argv;      /* the call's parameters (nparams of them), borrowed */
    PyObject *dims[2 * MAXP];   /* p's shape at [p], its stride() at [MAXP + p]; read when that bit of held is set */
    uint64_t held;
    int64_t sym[MAXS];
    int sym_ok[MAXS];           /* 0: the scalar was not an exact int (programs reading it bail) */
    uint64_t ptr[MAXP];
    uint32_t have_ptr;          /* bit p: ptr[p] was read */
} Call;

static void call_clear(Call *k) { /* release what the call read (no per-parameter loop: bits) */
    for (uint64_t held = k->held; held; held &= held - 1) Py_XDECREF(k->dims[__builtin_ctzll(held)]);
}

static int ll_of(PyObject *o, int64_t *out) { /* exact ints only; 0 ok, else bail (error cleared) */
    int overflow = 0;
    long long v;
    if (!PyLong_CheckExact(o)) return BAIL;
    v = PyLong_AsLongLongAndOverflow(o, &overflow);
    if (overflow || (v == -1 && PyErr_Occurred())) {
        PyErr_Clear();
        return BAIL;
    }
    *out = v;
    return 0;
}

static int read_dim(Call *k, int kind, int p, int d, int64_t *out) {
    int at = kind == SRC_SHAPE ? p : MAXP + p;
    PyObject **cache = &k->dims[at], *obj = k->argv[p];
    void *h = tensor_handle(obj);
    int64_t ndim, *dims;
    if (h && !tabi.dim(h, &ndim) && !(kind == SRC_SHAPE ? tabi.sizes : tabi.strides)(h, &dims)) {
        if (d >= ndim) return BAIL;
        *out = dims[d];
        return 0;
    }
    if (!(k->held >> at & 1)) {
        *cache = kind == SRC_SHAPE ? PyObject_GetAttr(obj, s_shape) : PyObject_CallMethodObjArgs(obj, s_stride, NULL);
        k->held |= (uint64_t)1 << at;
    }
    if (*cache == NULL || !PyTuple_Check(*cache) || d >= PyTuple_Size(*cache)) {
        PyErr_Clear();
        return BAIL;
    }
    return ll_of(PyTuple_GetItem(*cache, d), out);
}

/* A scalar parameter's int value: exact ints, and bools as 0/1 (what Python's arithmetic and
 * struct.pack make of them); anything else bails. */
static int scalar_of(PyObject *o, int64_t *out) {
    if (o == Py_True || o == Py_False) {
        *out = o == Py_True;
        return 0;
    }
    return ll_of(o, out);
}

static int read_symbols(Core *c, Call *k) {
    for (int i = 0; i < c->nsrc; i++) {
        int kind = c->src[i][0], p = c->src[i][1], d = c->src[i][2];
        k->sym_ok[i] = 1;
        if (kind == SRC_SCALAR) {
            if (scalar_of(k->argv[p], &k->sym[i])) k->sym_ok[i] = 0;
        } else if (read_dim(k, kind, p, d, &k->sym[i])) {
            return BAIL;
        }
    }
    return 0;
}

static int read_ptr(Call *k, int p, uint64_t *out) {
    if (k->have_ptr & (1u << p)) {
        *out = k->ptr[p];
        return 0;
    }
    PyObject *obj = k->argv[p];
    void *h = tensor_handle(obj), *data;
    if (h && !tabi.data_ptr(h, &data)) {
        *out = (uint64_t)(uintptr_t)data;
        k->ptr[p] = *out, k->have_ptr |= 1u << p;
        return 0;
    }
    PyObject *r = PyObject_CallMethodObjArgs(obj, s_data_ptr, NULL); /* torch: no bound method is made */
    if (r == NULL && PyErr_ExceptionMatches(PyExc_AttributeError)) {
        PyErr_Clear();
        PyObject *cai = PyObject_GetAttr(obj, s_cai);
        PyObject *data = (cai && PyDict_Check(cai)) ? PyDict_GetItemWithError(cai, s_data) : NULL;
        if (data && PyTuple_Check(data) && PyTuple_Size(data) >= 1) {
            r = PyTuple_GetItem(data, 0);
            Py_XINCREF(r);
        }
        Py_XDECREF(cai);
    }
    if (r == NULL || !PyLong_CheckExact(r)) {
        Py_XDECREF(r);
        PyErr_Clear();
        return BAIL;
    }
    *out = PyLong_AsUnsignedLongLong(r);
    Py_DECREF(r);
    if (PyErr_Occurred()) {
        PyErr_Clear();
        return BAIL;
    }
    k->ptr[p] = *out, k->have_ptr |= 1u << p;
    return 0;
}
