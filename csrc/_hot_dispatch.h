/* _hot.c, part 4: runtime.launch's plan-cache hit without Python frames.
 *
 * Dispatch(fast_plans, nparams, tensor_positions, keyed_positions, direct_positions, cell, slow) is
 * called as dispatch(args, kwargs, stream).  It builds the same key as runtime/_signature.py's
 * fast_signature -- per tensor (dtype, size(), stride(), device), per keyed scalar (type, value),
 * per pass-through scalar its type -- looks the plan up and runs it; anything else (keywords, a
 * tensor that is not exactly cell[0], an odd scalar type, a miss) goes to slow(args, kwargs, stream).
 */

typedef struct {
    PyObject_HEAD
    PyObject *plans, *cell, *slow;
    int nparams, nt, nk, nd;
    int t[MAXP], k[MAXP], d[MAXP];
} Dispatch;

static PyObject *s_dtype, *s_size, *s_devattr, *s_runattr;
static PyObject *core_type;

static int positions(PyObject *seq, int *out, int *n) {
    if ((*n = parse_table(seq, MAXP, "positions")) < 0) return -1;
    for (int i = 0; i < *n; i++) {
        long long v;
        if (as_int(seq, i, &v)) return -1;
        out[i] = (int)v;
    }
    return 0;
}

static int dispatch_init(PyObject *self, PyObject *args, PyObject *kw) {
    Dispatch *d = (Dispatch *)self;
    PyObject *plans, *t, *k, *dd, *cell, *slow;
    if (!PyArg_ParseTuple(args, "O!iOOOO!O", &PyDict_Type, &plans, &d->nparams, &t, &k, &dd, &PyList_Type, &cell,
                          &slow))
        return -1;
    if (positions(t, d->t, &d->nt) || positions(k, d->k, &d->nk) || positions(dd, d->d, &d->nd)) return -1;
    Py_INCREF(plans), Py_INCREF(cell), Py_INCREF(slow);
    d->plans = plans, d->cell = cell, d->slow = slow;
    return 0;
}

static void dispatch_dealloc(PyObject *self) {
    Dispatch *d = (Dispatch *)self;
    PyTypeObject *tp = Py_TYPE(self);
    Py_XDECREF(d->plans), Py_XDECREF(d->cell), Py_XDECREF(d->slow);
    ((freefunc)PyType_GetSlot(tp, Py_tp_free))(self);
    Py_DECREF(tp);
}

/* The fast key of `a`, or NULL (no exception) when the call does not have one. */
static PyObject *fast_key(Dispatch *d, PyObject *a) {
    PyObject *cls = PyList_Size(d->cell) ? PyList_GetItem(d->cell, 0) : NULL;
    if (cls == NULL || cls == Py_None || PyTuple_Size(a) != d->nparams) return NULL;
    PyObject *key = PyTuple_New(4 * d->nt + 2 * d->nk + d->nd);
    int j = 0;
    for (int i = 0; key && i < d->nt; i++) {
        PyObject *x = PyTuple_GetItem(a, d->t[i]);
        if ((PyObject *)Py_TYPE(x) != cls) goto no;
        PyObject *parts[4] = {PyObject_GetAttr(x, s_dtype), PyObject_CallMethodObjArgs(x, s_size, NULL),
                              PyObject_CallMethodObjArgs(x, s_stride, NULL), PyObject_GetAttr(x, s_devattr)};
        for (int p = 0; p < 4; p++) {
            if (parts[p] == NULL) {
                for (int q = p + 1; q < 4; q++) Py_XDECREF(parts[q]);
                goto no;
            }
            PyTuple_SetItem(key, j++, parts[p]);
        }
    }
    for (int i = 0; key && i < d->nk; i++) {
        PyObject *s = PyTuple_GetItem(a, d->k[i]);
        PyObject *tp = (PyObject *)Py_TYPE(s);
        if (tp != (PyObject *)&PyLong_Type && tp != (PyObject *)&PyFloat_Type && tp != (PyObject *)&PyBool_Type)
            goto no;
        Py_INCREF(tp), Py_INCREF(s);
        PyTuple_SetItem(key, j++, tp);
        PyTuple_SetItem(key, j++, s);
    }
    for (int i = 0; key && i < d->nd; i++) {
        PyObject *tp = (PyObject *)Py_TYPE(PyTuple_GetItem(a, d->d[i]));
        Py_INCREF(tp);
        PyTuple_SetItem(key, j++, tp);
    }
    return key;
no:
    Py_DECREF(key);
    PyErr_Clear();
    return NULL;
}

static PyObject *run_values(Core *c, PyObject *values, PyObject *stream);

static PyObject *dispatch_call(PyObject *self, PyObject *args, PyObject *kw) {
    Dispatch *d = (Dispatch *)self;
    PyObject *a, *kwargs, *stream, *plan = NULL;
    if (!PyArg_ParseTuple(args, "O!OO", &PyTuple_Type, &a, &kwargs, &stream)) return NULL;
    if (d->slow == NULL) {
        PyErr_SetString(PyExc_TypeError, "_hot.Dispatch was not initialised");
        return NULL;
    }
    if (!(PyDict_Check(kwargs) && PyDict_Size(kwargs))) {
        PyObject *key = fast_key(d, a);
        if (key) {
            plan = PyDict_GetItemWithError(d->plans, key); /* borrowed */
            Py_XINCREF(plan);
            Py_DECREF(key);
            if (plan == NULL && PyErr_Occurred()) return NULL;
        }
    }
    if (plan == NULL) return PyObject_CallFunctionObjArgs(d->slow, a, kwargs, stream, NULL);
    PyObject *r = (PyObject *)Py_TYPE(plan) == core_type
                      ? run_values((Core *)plan, a, stream)
                      : PyObject_CallMethodObjArgs(plan, s_runattr, a, stream, NULL);
    Py_DECREF(plan);
    return r;
}

static PyType_Slot dispatch_slots[] = {
    {Py_tp_init, dispatch_init},
    {Py_tp_dealloc, dispatch_dealloc},
    {Py_tp_call, dispatch_call},
    {Py_tp_doc, "Dispatch(fast_plans, ...)(args, kwargs, stream): runtime.launch's plan-cache hit "
                "(built by tilebin.runtime._registry; see csrc/_hot_dispatch.h)"},
    {0, NULL},
};

static PyType_Spec dispatch_spec = {"tilebin.runtime._hot.Dispatch", sizeof(Dispatch), 0, Py_TPFLAGS_DEFAULT,
                                    dispatch_slots};
