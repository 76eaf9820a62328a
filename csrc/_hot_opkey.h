/* _hot.c, part 5: an op's memo key for its tensors, and their per-call tests, read through torch's C shim.
 *
 * tilebin.ops keys a call's configuration by each tensor's dtype, device, rank and sizes (all but the
 * first where that is the token count), then runs the per-call tests a stored configuration leaves
 * (contiguity, pointer alignment, an element limit, token counts that must agree).  Through the Python
 * accessors that costs ~0.3 us a tensor; OpKey(entries).key(*args) does it through the shim
 * (_hot_tensor.h) for the tensors `entries` names, and returns:
 *   bytes  the key part of those tensors (every per-call test passed);
 *   None   a per-call test failed: the op's Python key and checks say why (or run the call);
 *   False  one of them is neither a GPU tensor of exactly torch.Tensor's type that the shim reads nor an
 *          optional's None: the op's Python key takes the call (ops/_compiled_key.py keeps both).
 * An entry: (position, flags, rank or -1, alignment in bytes or 0, element limit or -1, index of the
 * entry whose first size this one's equals, or -1).
 */
#define OK_OPTIONAL 1
#define OK_ROWS 2   /* rows_vary: the first size is no part of the key */
#define OK_CONTIG 4 /* contiguous, as torch's is_contiguous() computes it */

typedef struct {
    int pos, flags, ndim, align, rows_of;
    int64_t max_numel;
} OpKeyEntry;

typedef struct {
    PyObject_HEAD
    int n, nparams;
    OpKeyEntry e[MAXP];
} OpKey;

static int opkey_init(PyObject *self, PyObject *args, PyObject *kw) {
    OpKey *k = (OpKey *)self;
    PyObject *entries;
    if (!PyArg_ParseTuple(args, "iO!", &k->nparams, &PyTuple_Type, &entries)) return -1;
    if ((k->n = parse_table(entries, MAXP, "entries")) < 0) return -1;
    for (int i = 0; i < k->n; i++) {
        PyObject *t = PyTuple_GetItem(entries, i);
        long long v[6];
        if (!PyTuple_Check(t) || PyTuple_Size(t) != 6) {
            PyErr_SetString(PyExc_ValueError, "an OpKey entry is (pos, flags, ndim, align, max_numel, rows_of)");
            return -1;
        }
        for (int j = 0; j < 6; j++)
            if (as_int(t, j, &v[j])) return -1;
        if (v[0] < 0 || v[0] >= k->nparams || v[5] >= k->n || v[3] < 0) {
            PyErr_SetString(PyExc_ValueError, "an OpKey entry's position, alignment or rows_of is out of range");
            return -1;
        }
        k->e[i] = (OpKeyEntry){(int)v[0], (int)v[1], (int)v[2], (int)v[3], (int)v[5], v[4]};
    }
    return 0;
}

/* torch's default-format contiguity of sizes/strides (c10 compute_contiguous). */
static int contiguous(int64_t ndim, const int64_t *sizes, const int64_t *strides, int64_t numel) {
    int64_t z = 1;
    if (numel == 0) return 1;
    for (int64_t d = ndim - 1; d >= 0; d--) {
        if (sizes[d] == 1) continue;
        if (strides[d] != z) return 0;
        z *= sizes[d];
    }
    return 1;
}

/* Entry e's tensor x: its words appended at *w; 0, 1 (None: a per-call test failed) or 2 (False). */
static int opkey_one(const OpKeyEntry *e, PyObject *x, TensorRead *r, int64_t **w) {
    void *h, *data;
    if (x == Py_None && e->flags & OK_OPTIONAL) {
        r->ndim = -1;
        *(*w)++ = -1;
        return 0;
    }
    /* (not on the GPU, ordinal -1: the Python key, whose device part tells it apart, takes it) */
    if ((h = tensor_handle(x)) == NULL || tabi_read(h, r) || r->ndim > RD || r->ordinal < 0) return 2;
    if (e->ndim >= 0 && r->ndim != e->ndim) return 1;
    int64_t numel = 1;
    for (int64_t d = 0; d < r->ndim; d++) numel *= r->sizes[d];
    if ((e->flags & OK_CONTIG && !contiguous(r->ndim, r->sizes, r->strides, numel)) ||
        (e->max_numel >= 0 && numel > e->max_numel))
        return 1;
    if (e->align && numel && (tabi.data_ptr(h, &data) || (uintptr_t)data % (unsigned)e->align)) return 1;
    *(*w)++ = r->code, *(*w)++ = r->ordinal, *(*w)++ = r->ndim;
    for (int64_t d = e->flags & OK_ROWS && r->ndim ? 1 : 0; d < r->ndim; d++) *(*w)++ = r->sizes[d];
    return 0;
}

static PyObject *opkey_key(PyObject *self, PyObject *const *args, Py_ssize_t n) {
    OpKey *k = (OpKey *)self;
    int64_t words[MAXP * (3 + RD)], *w = words;
    TensorRead all[MAXP];
    if (n != k->nparams) Py_RETURN_FALSE; /* the Python key says what is wrong */
    for (int i = 0; i < k->n; i++) {
        int rc = opkey_one(&k->e[i], args[k->e[i].pos], &all[i], &w);
        if (rc == 1) Py_RETURN_NONE;
        if (rc == 2) Py_RETURN_FALSE;
    }
    for (int i = 0; i < k->n; i++) { /* token counts that must agree (both read above; -1: an optional's None) */
        const TensorRead *r = &all[i], *ref = k->e[i].rows_of >= 0 ? &all[k->e[i].rows_of] : NULL;
        if (ref && (r->ndim < 1 || ref->ndim < 1 || r->sizes[0] != ref->sizes[0])) Py_RETURN_NONE;
    }
    return PyBytes_FromStringAndSize((const char *)words, (Py_ssize_t)((char *)w - (char *)words));
}

static PyMethodDef opkey_methods[] = {
    {"key", (PyCFunction)(void (*)(void))opkey_key, METH_FASTCALL,
     "key(*args): bytes (the tensors' key part), None (a per-call test failed) or False (use the Python key)"},
    {NULL, NULL, 0, NULL},
};

static void opkey_dealloc(PyObject *self) {
    PyTypeObject *tp = Py_TYPE(self);
    ((freefunc)PyType_GetSlot(tp, Py_tp_free))(self);
    Py_DECREF(tp);
}

static PyType_Slot opkey_slots[] = {
    {Py_tp_init, opkey_init},
    {Py_tp_dealloc, opkey_dealloc},
    {Py_tp_methods, opkey_methods},
    {Py_tp_doc, "OpKey(nparams, entries): an op's tensor memo key through torch's C shim (csrc/_hot_opkey.h)"},
    {0, NULL},
};

static PyType_Spec opkey_spec = {"tilebin.runtime._hot.OpKey", sizeof(OpKey), 0, Py_TPFLAGS_DEFAULT, opkey_slots};
