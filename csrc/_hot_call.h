/* _hot.c, part 3: one call -- pointers, stream, packing, context, launches (see the top of _hot.c). */

/* Python-side helpers: call twin.<name>(*args) and return the result (NULL with an exception set). */
static PyObject *twin_call(Core *c, PyObject *name, PyObject *a, PyObject *b) {
    return PyObject_CallMethodObjArgs(c->twin, name, a, b, NULL);
}

static Device *device_state(Core *c, long ordinal) {
    for (int i = 0; i < c->ndev; i++)
        if (c->dev[i].ordinal == ordinal) return &c->dev[i];
    PyObject *ord = PyLong_FromLong(ordinal);
    PyObject *r = ord ? twin_call(c, s_device, ord, NULL) : NULL; /* (ctx, (fn, ...)); raises for bad devices */
    Py_XDECREF(ord);
    if (r == NULL) return NULL;
    Device d = {ordinal, NULL, {0}};
    long long v;
    int bad = as_int(r, 0, &v);
    d.ctx = (void *)(intptr_t)v;
    for (int i = 0; !bad && i < c->nlaunch; i++) {
        bad = as_int(PyTuple_GetItem(r, 1), i, &v);
        d.fn[i] = (void *)(intptr_t)v;
    }
    Py_DECREF(r);
    if (bad) return NULL;
    if (c->ndev == MAXD) c->ndev = 0; /* a table of recent devices: more than 16 just reloads handles */
    c->dev[c->ndev] = d;
    return &c->dev[c->ndev++];
}

typedef struct {
    unsigned grid[MAXL][3];
    int skip[MAXL];
    uint64_t slot[MAXL][MAXA];
    void *param[MAXL][MAXA];
    _Alignas(64) unsigned char desc[MAXT][DESC];
} Packed;

/* The 128 descriptor bytes of TMA slot `t` for global address `ptr`: one of the slot's RECENT_PTRS
 * cached descriptors, or (a new address) encoded by the twin into the oldest entry. */
static int tma_bytes(Core *c, int t, uint64_t ptr, unsigned char *out) {
    TmaCache *tc = NULL;
    for (int r = 0; r < RECENT_PTRS && tc == NULL; r++)
        if (c->tma[t][r].valid && c->tma[t][r].ptr == ptr) tc = &c->tma[t][r];
    if (tc == NULL) {
        PyObject *ti = PyLong_FromLong(t), *pi = PyLong_FromUnsignedLongLong(ptr);
        PyObject *r = (ti && pi) ? twin_call(c, s_tma, ti, pi) : NULL;
        Py_XDECREF(ti), Py_XDECREF(pi);
        char *buf;
        Py_ssize_t n;
        if (r == NULL || PyBytes_AsStringAndSize(r, &buf, &n) || n != DESC) {
            Py_XDECREF(r);
            if (!PyErr_Occurred()) PyErr_SetString(PyExc_RuntimeError, "TMA descriptor: expected 128 bytes");
            return -1;
        }
        tc = &c->tma[t][c->tma_next[t]]; /* GIL held from here to the copy below: no other call interleaves */
        c->tma_next[t] = (c->tma_next[t] + 1) % RECENT_PTRS;
        memcpy(tc->desc, buf, DESC);
        tc->ptr = ptr, tc->valid = 1;
        Py_DECREF(r);
    }
    memcpy(out, tc->desc, DESC);
    return 0;
}

/* Grid, then arguments, of launch `i` into `pk`: 0, BAIL, or -1 (exception set). */
static int pack_launch(Core *c, Call *k, int i, Packed *pk) {
    Launch *ln = &c->launch[i];
    int64_t g[3];
    for (int d = 0; d < 3; d++)
        if (run_prog(&ln->grid[d], k, &g[d])) return BAIL;
    if (!(g[0] > 0 && g[0] <= 2147483647 && g[1] > 0 && g[1] <= 65535 && g[2] > 0 && g[2] <= 65535)) {
        if (g[0] && g[1] && g[2]) return BAIL; /* out of range: the twin raises */
        pk->skip[i] = 1;                      /* an empty problem: nothing to launch */
        return 0;
    }
    pk->skip[i] = 0;
    for (int d = 0; d < 3; d++) pk->grid[i][d] = (unsigned)g[d];
    for (int j = 0; j < ln->nargs; j++) {
        Arg *a = &ln->args[j];
        uint64_t *slot = &pk->slot[i][j], ptr;
        int64_t v;
        int rc = 0;
        *slot = 0;
        pk->param[i][j] = slot;
        switch (a->kind) {
        case ARG_PTR: rc = read_ptr(k, a->a, slot); break;
        case ARG_PROG: rc = run_prog(&a->prog, k, &v) ? BAIL : pack_int(a->a, v, slot); break;
        case ARG_DIRECT: rc = pack_object(a->a, k->argv[a->b], slot); break;
        case ARG_CONST: *slot = a->raw; break;
        case ARG_TMA:
            if ((rc = read_ptr(k, a->b, &ptr)) == 0) rc = tma_bytes(c, a->a, ptr, pk->desc[a->a]);
            pk->param[i][j] = pk->desc[a->a];
            break;
        default: rc = BAIL;
        }
        if (rc) return rc;
    }
    return 0;
}

/* Bound launchers: this call's pointers, checked by the twin unless one of the last RECENT_PTRS sets
 * that passed equals them (the check depends on the pointers alone: the launcher's geometry is fixed). */
static int check_pointers(Core *c, Call *k) {
    uint64_t p[MAXP];
    int rc;
    size_t n = sizeof(uint64_t) * (size_t)c->ntensors;
    for (int i = 0; i < c->ntensors; i++)
        if ((rc = read_ptr(k, c->tensors[i], &p[i]))) return rc;
    for (int r = 0; r < c->ok_count; r++)
        if (memcmp(c->ok_ptrs[r], p, n) == 0) return 0;
    PyObject *t = PyTuple_New(c->ntensors);
    for (int i = 0; t && i < c->ntensors; i++) PyTuple_SetItem(t, i, PyLong_FromUnsignedLongLong(p[i]));
    PyObject *r = t ? twin_call(c, s_check, t, NULL) : NULL; /* raises ArgumentError */
    Py_XDECREF(t);
    if (r == NULL) return -1;
    Py_DECREF(r);
    memcpy(c->ok_ptrs[c->ok_next], p, n); /* GIL held since the check returned */
    c->ok_next = (c->ok_next + 1) % RECENT_PTRS;
    if (c->ok_count < RECENT_PTRS) c->ok_count++;
    return 0;
}

static int get_stream(Core *c, long ordinal, PyObject *stream, uint64_t *out) {
    PyObject *r;
    if (stream != NULL && stream != Py_None) {
        int64_t v;
        if (ll_of(stream, &v) == 0 && v >= 0) {
            *out = (uint64_t)v;
            return 0;
        }
        r = twin_call(c, s_stream, stream, NULL); /* converts, or raises ArgumentError */
    } else if (c->stream_getter == Py_None) {
        *out = 0;
        return 0;
    } else {
        PyObject *ord = PyLong_FromLong(ordinal);
        r = ord ? PyObject_CallFunctionObjArgs(c->stream_getter, ord, NULL) : NULL;
        Py_XDECREF(ord);
    }
    if (r == NULL) return -1;
    *out = PyLong_AsUnsignedLongLong(r);
    Py_DECREF(r);
    return PyErr_Occurred() ? -1 : 0;
}

static int launch_one(Core *c, Launch *ln, void *fn, Packed *pk, int i, uint64_t stream) {
    int err;
    unsigned *g = pk->grid[i];
    void **params = pk->param[i];
    if (ln->nattrs) {
        LaunchConfig cfg = {g[0], g[1], g[2], ln->block[0], ln->block[1], ln->block[2], ln->smem,
                            (void *)(uintptr_t)stream, ln->attrs, (unsigned)ln->nattrs};
        Py_BEGIN_ALLOW_THREADS
        err = c->cu_launch_ex(&cfg, fn, params, NULL);
        Py_END_ALLOW_THREADS
    } else {
        Py_BEGIN_ALLOW_THREADS
        err = c->cu_launch(fn, g[0], g[1], g[2], ln->block[0], ln->block[1], ln->block[2], ln->smem,
                           (void *)(uintptr_t)stream, params, NULL);
        Py_END_ALLOW_THREADS
    }
    return err;
}

/* A failed driver call: the twin retries (context errors) or raises DeviceError.  i = -1: restoring. */
static int failed(Core *c, int i, int err, Packed *pk, uint64_t stream, long ordinal) {
    unsigned *g = i >= 0 ? pk->grid[i] : pk->grid[0];
    PyObject *t = Py_BuildValue("(ii(III)KKl)", i, err, g[0], g[1], g[2], (unsigned long long)stream,
                                (unsigned long long)(uintptr_t)(i >= 0 ? pk->param[i] : NULL), ordinal);
    PyObject *r = t ? twin_call(c, s_failed, t, NULL) : NULL;
    Py_XDECREF(t);
    if (r == NULL) return -1;
    Py_DECREF(r);
    return 0;
}

static int fire(Core *c, Device *dev, Packed *pk, uint64_t stream) {
    void *cur = NULL;
    if (c->ctx_get(&cur)) return BAIL;
    if (cur != dev->ctx && c->ctx_set(dev->ctx)) return BAIL;
    void *restore = (cur != dev->ctx) ? cur : NULL;
    int rc = 0, err;
    for (int i = 0; i < c->nlaunch && rc == 0; i++) {
        if (pk->skip[i]) continue;
        err = launch_one(c, &c->launch[i], dev->fn[i], pk, i, stream);
        if (err) rc = failed(c, i, err, pk, stream, dev->ordinal);
    }
    if (restore && (err = c->ctx_set(restore)) && rc == 0) rc = failed(c, -1, err, pk, stream, dev->ordinal);
    return rc;
}

static long ordinal_of(Core *c, Call *k, int *rc) {
    if (c->bound) return c->dev[0].ordinal;
    void *h = tensor_handle(k->argv[c->first]);
    long ordinal;
    if (h && tabi_ordinal(h, &ordinal) == 0) {
        *rc = ordinal < 0 ? BAIL : 0; /* not on the GPU: the twin says so */
        return ordinal;
    }
    PyObject *r = PyObject_CallMethodObjArgs(k->argv[c->first], s_get_device, NULL);
    int64_t v = -1;
    *rc = r == NULL ? (PyErr_Clear(), BAIL) : ll_of(r, &v);
    Py_XDECREF(r);
    if (*rc == 0 && v < 0) *rc = BAIL; /* not a CUDA tensor: the twin says so */
    return (long)v;
}

static int do_call(Core *c, Call *k, PyObject *stream) {
    int rc = 0;
    uint64_t s;
    Packed pk;
    if ((rc = read_symbols(c, k))) return rc;
    long ordinal = ordinal_of(c, k, &rc);
    if (rc) return rc;
    if (c->bound && (rc = check_pointers(c, k))) return rc;
    for (int i = 0; i < c->nlaunch; i++)
        if ((rc = pack_launch(c, k, i, &pk))) return rc;
    Device *dev = device_state(c, ordinal);
    if (dev == NULL) return -1;
    if (get_stream(c, ordinal, stream, &s)) return -1;
    return fire(c, dev, &pk, s);
}

/* A tuple of the n objects at argv (new reference; NULL with an exception set). */
static PyObject *tuple_of(PyObject *const *argv, Py_ssize_t n) {
    PyObject *t = PyTuple_New(n);
    for (Py_ssize_t i = 0; t && i < n; i++) {
        Py_INCREF(argv[i]);
        PyTuple_SetItem(t, i, argv[i]);
    }
    return t;
}

/* The end of a call: rc 0 (done), -1 (raise), else the twin runs it with `args` (the caller's tuple)
 * or, when NULL, the n objects at argv. */
static PyObject *finish(Core *c, Call *k, int rc, PyObject *stream, int run, PyObject *args, PyObject *const *argv,
                        Py_ssize_t n) {
    PyObject *t, *r;
    if (k) call_clear(k);
    if (rc == 0) Py_RETURN_NONE;
    if (rc < 0) return NULL;
    PyErr_Clear();
    if ((t = args ? args : tuple_of(argv, n)) == NULL) return NULL;
    r = run ? twin_call(c, s_run, t, stream ? stream : Py_None) : twin_call(c, s_call, t, NULL);
    if (args == NULL) Py_DECREF(t);
    return r;
}

/* A call's state: nothing read yet (bit sets, no per-parameter clearing). */
static void call_init(Call *k, Core *c, PyObject *const *argv) {
    k->argv = argv;
    k->held = 0, k->have_ptr = 0;
}

static int initialised(Core *c) {
    if (c->twin != NULL) return 1;
    PyErr_SetString(PyExc_TypeError, "_hot.Launcher was not initialised");
    return 0;
}

/* The items of tuple t into av (borrowed: t holds them); 0, or BAIL when there are more than MAXP. */
static int items_of(PyObject *t, PyObject **av, Py_ssize_t *n) {
    *n = PyTuple_Size(t);
    if (*n > MAXP) return BAIL;
    for (Py_ssize_t i = 0; i < *n; i++) av[i] = PyTuple_GetItem(t, i);
    return 0;
}

/* launcher(*args): the unchecked contract (bound launchers: run(args) on the default stream). */
static PyObject *core_call(PyObject *self, PyObject *args, PyObject *kw) {
    Core *c = (Core *)self;
    Call k;
    PyObject *av[MAXP];
    Py_ssize_t n;
    if (!initialised(c)) return NULL;
    if ((kw && PyDict_Size(kw)) || items_of(args, av, &n) || n != c->nparams)
        return finish(c, NULL, BAIL, NULL, c->bound, args, NULL, 0);
    call_init(&k, c, av);
    return finish(c, &k, do_call(c, &k, NULL), NULL, c->bound, args, NULL, 0);
}

/* A bound launcher's run of the n parameters at argv (`args`: their tuple, when the caller has one). */
static PyObject *run_array(Core *c, PyObject *const *argv, Py_ssize_t n, PyObject *stream, PyObject *args) {
    Call k;
    if (!initialised(c)) return NULL;
    if (n != c->nparams) return finish(c, NULL, BAIL, stream, 1, args, argv, n);
    call_init(&k, c, argv);
    return finish(c, &k, do_call(c, &k, stream), stream, 1, args, argv, n);
}

static PyObject *run_values(Core *c, PyObject *values, PyObject *stream) {
    PyObject *av[MAXP], *t = PySequence_Tuple(values), *r;
    Py_ssize_t n;
    if (t == NULL) return NULL;
    r = items_of(t, av, &n) ? (initialised(c) ? finish(c, NULL, BAIL, stream, 1, t, NULL, 0) : NULL)
                            : run_array(c, av, n, stream, t);
    Py_DECREF(t);
    return r;
}

/* launcher.run(values, stream=None): a bound launcher's call (values: the parameters in order).
 * METH_FASTCALL: a PreparedCall (functools.partial of this method) reaches it without an argument tuple. */
static PyObject *core_run(PyObject *self, PyObject *const *args, Py_ssize_t nargs, PyObject *kwnames) {
    PyObject *given[2] = {nargs > 0 ? args[0] : NULL, nargs > 1 ? args[1] : NULL};
    Py_ssize_t nkw = kwnames ? PyTuple_Size(kwnames) : 0;
    if (nargs > 2) {
        PyErr_Format(PyExc_TypeError, "run() takes at most 2 arguments (%zd given)", nargs);
        return NULL;
    }
    for (Py_ssize_t i = 0; i < nkw; i++) {
        PyObject *name = PyTuple_GetItem(kwnames, i);
        int at = PyUnicode_CompareWithASCIIString(name, "values") == 0   ? 0
                 : PyUnicode_CompareWithASCIIString(name, "stream") == 0 ? 1
                                                                           : -1;
        if (at < 0 || given[at] != NULL) {
            PyErr_Format(PyExc_TypeError, "run() got an unexpected or repeated keyword argument %R", name);
            return NULL;
        }
        given[at] = args[nargs + i];
    }
    if (given[0] == NULL) {
        PyErr_SetString(PyExc_TypeError, "run() missing required argument 'values'");
        return NULL;
    }
    return run_values((Core *)self, given[0], given[1] ? given[1] : Py_None);
}

static PyObject *core_twin(PyObject *self, PyObject *unused) {
    Core *c = (Core *)self;
    Py_INCREF(c->twin);
    return c->twin;
}

static PyMethodDef core_methods[] = {
    {"run", (PyCFunction)(void (*)(void))core_run, METH_FASTCALL | METH_KEYWORDS,
     "run(values, stream=None): launch with these parameters (see the Python twin's run)"},
    {"twin", core_twin, METH_NOARGS, "the pure-Python Launcher this one mirrors"},
    {NULL, NULL, 0, NULL},
};
