/* _hot.c, part 4: runtime.launch's plan-cache hit without Python frames.
 *
 * Dispatch(fast_plans, nparams, tensor_positions, keyed_positions, direct_positions, cell, slow) is
 * called as dispatch(args, kwargs, stream).  With no keywords, it compares the call's signature values
 * with the RECENT signatures it last found (_hot_recent.h) and runs that plan; else it builds the same
 * key as runtime/_signature.py's fast_signature -- per tensor (dtype, size(), stride(), device), per
 * keyed scalar (type, value), per pass-through scalar its type -- looks the plan up, remembers it and
 * runs it; anything else (keywords, a tensor that is not exactly cell[0], an odd scalar type, a miss)
 * goes to slow(args, kwargs, stream).  dispatch.forget() empties the recent signatures (the registry
 * calls it when it evicts plans).
 */

static PyObject *s_dtype, *s_size, *s_devattr, *s_runattr;
static PyObject *core_type;

#include "_hot_recent.h"

typedef struct {
    PyObject_HEAD
    PyObject *plans, *cell, *slow;
    Positions pos;
    int next; /* the recent entry to replace next */
    Recent recent[RECENT];
} Dispatch;

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
    Positions *p = &d->pos;
    if (d->slow != NULL) {
        PyErr_SetString(PyExc_TypeError, "_hot.Dispatch is initialised once");
        return -1;
    }
    if (!PyArg_ParseTuple(args, "O!iOOOO!O", &PyDict_Type, &plans, &p->nparams, &t, &k, &dd, &PyList_Type, &cell,
                          &slow))
        return -1;
    if (positions(t, p->t, &p->nt) || positions(k, p->k, &p->nk) || positions(dd, p->d, &p->nd)) return -1;
    if (s_is_cuda == NULL && (s_is_cuda = PyUnicode_InternFromString(HOT_IS_CUDA)) == NULL) return -1;
    Py_INCREF(plans), Py_INCREF(cell), Py_INCREF(slow);
    d->plans = plans, d->cell = cell, d->slow = slow;
    return 0;
}

static void dispatch_dealloc(PyObject *self) {
    Dispatch *d = (Dispatch *)self;
    PyTypeObject *tp = Py_TYPE(self);
    for (int r = 0; r < RECENT; r++) recent_clear(&d->recent[r], &d->pos);
    Py_XDECREF(d->plans), Py_XDECREF(d->cell), Py_XDECREF(d->slow);
    ((freefunc)PyType_GetSlot(tp, Py_tp_free))(self);
    Py_DECREF(tp);
}

/* The fast key of the n arguments at a, or NULL (no exception) when the call does not have one. */
static PyObject *fast_key(Dispatch *d, PyObject *const *a, Py_ssize_t n) {
    PyObject *cls = PyList_Size(d->cell) ? PyList_GetItem(d->cell, 0) : NULL;
    if (cls == NULL || cls == Py_None || n != d->pos.nparams) return NULL;
    PyObject *key = PyTuple_New(4 * d->pos.nt + 2 * d->pos.nk + d->pos.nd);
    int j = 0;
    for (int i = 0; key && i < d->pos.nt; i++) {
        PyObject *x = a[d->pos.t[i]];
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
    for (int i = 0; key && i < d->pos.nk; i++) {
        PyObject *s = a[d->pos.k[i]];
        PyObject *tp = (PyObject *)Py_TYPE(s);
        if (tp != (PyObject *)&PyLong_Type && tp != (PyObject *)&PyFloat_Type && tp != (PyObject *)&PyBool_Type)
            goto no;
        Py_INCREF(tp), Py_INCREF(s);
        PyTuple_SetItem(key, j++, tp);
        PyTuple_SetItem(key, j++, s);
    }
    for (int i = 0; key && i < d->pos.nd; i++) {
        PyObject *tp = (PyObject *)Py_TYPE(a[d->pos.d[i]]);
        Py_INCREF(tp);
        PyTuple_SetItem(key, j++, tp);
    }
    return key;
no:
    Py_DECREF(key);
    PyErr_Clear();
    return NULL;
}

static PyObject *run_array(Core *c, PyObject *const *argv, Py_ssize_t n, PyObject *stream, PyObject *args);
static PyObject *tuple_of(PyObject *const *argv, Py_ssize_t n);

/* The plan of a call with no keywords (a new reference), or NULL: none (no exception) or an error. */
static PyObject *find_plan(Dispatch *d, PyObject *const *a, Py_ssize_t n) {
    PyObject *cls = PyList_Size(d->cell) ? PyList_GetItem(d->cell, 0) : NULL, *plan = NULL;
    Sig sig;
    if (cls == NULL || cls == Py_None || n != d->pos.nparams) return NULL;
    int have = read_sig(&d->pos, cls, a, &sig) == 0;
    if (have && (plan = recent_find(d->recent, &d->pos, &sig)) != NULL) {
        sig_release(&sig, d->pos.nt);
        return plan;
    }
    PyObject *key = fast_key(d, a, n);
    if (key) {
        plan = PyDict_GetItemWithError(d->plans, key); /* borrowed */
        Py_XINCREF(plan);
        Py_DECREF(key);
    }
    if (plan && have && (PyObject *)Py_TYPE(plan) == core_type) {
        int slot = d->next;
        d->next = (slot + 1) % RECENT;
        recent_add(&d->recent[slot], &d->pos, &sig, plan);
    }
    if (have) sig_release(&sig, d->pos.nt);
    return plan;
}

/* One launch through `d` of the n kernel arguments at a (`args`: their tuple when the caller has one,
 * else NULL); kwargs NULL when none were given. */
static PyObject *dispatch_run(Dispatch *d, PyObject *const *a, Py_ssize_t n, PyObject *args, PyObject *kwargs,
                              PyObject *stream) {
    PyObject *plan = NULL, *r = NULL, *t;
    if (d->slow == NULL) {
        PyErr_SetString(PyExc_TypeError, "_hot.Dispatch was not initialised");
        return NULL;
    }
    if (!(kwargs && PyDict_Check(kwargs) && PyDict_Size(kwargs)) && (plan = find_plan(d, a, n)) == NULL &&
        PyErr_Occurred())
        return NULL;
    if (plan != NULL && (PyObject *)Py_TYPE(plan) == core_type) {
        r = run_array((Core *)plan, a, n, stream, args);
        Py_DECREF(plan);
        return r;
    }
    if ((t = args ? args : tuple_of(a, n)) == NULL) {
        Py_XDECREF(plan);
        return NULL;
    }
    if (plan != NULL) {
        r = PyObject_CallMethodObjArgs(plan, s_runattr, t, stream, NULL);
        Py_DECREF(plan);
    } else {
        PyObject *kw = kwargs ? kwargs : PyDict_New(); /* the slow path's own dict: it may keep or change it */
        r = kw ? PyObject_CallFunctionObjArgs(d->slow, t, kw, stream, NULL) : NULL;
        if (kwargs == NULL) Py_XDECREF(kw);
    }
    if (args == NULL) Py_DECREF(t);
    return r;
}

/* dispatch(args, kwargs, stream) */
static PyObject *dispatch_call(PyObject *self, PyObject *args, PyObject *kw) {
    PyObject *a, *kwargs, *stream, *av[MAXP];
    Py_ssize_t n = 0;
    if (!PyArg_ParseTuple(args, "O!OO", &PyTuple_Type, &a, &kwargs, &stream)) return NULL;
    if (((Dispatch *)self)->slow && items_of(a, av, &n)) /* more arguments than a compiled plan takes */
        return PyObject_CallFunctionObjArgs(((Dispatch *)self)->slow, a, kwargs, stream, NULL);
    return dispatch_run((Dispatch *)self, av, n, a, kwargs, stream);
}

/* dispatch.forget(): empty the recent signatures (their plans may have left the plan cache). */
static PyObject *dispatch_forget(PyObject *self, PyObject *unused) {
    Dispatch *d = (Dispatch *)self;
    for (int r = 0; r < RECENT; r++) recent_clear(&d->recent[r], &d->pos);
    Py_RETURN_NONE;
}

static PyMethodDef dispatch_methods[] = {
    {"forget", dispatch_forget, METH_NOARGS, "empty the recent signatures (the registry evicted plans)"},
    {NULL, NULL, 0, NULL},
};

static PyType_Slot dispatch_slots[] = {
    {Py_tp_init, dispatch_init},
    {Py_tp_dealloc, dispatch_dealloc},
    {Py_tp_call, dispatch_call},
    {Py_tp_methods, dispatch_methods},
    {Py_tp_doc, "Dispatch(fast_plans, ...)(args, kwargs, stream): runtime.launch's plan-cache hit "
                "(built by tilebin.runtime._registry; see csrc/_hot_dispatch.h)"},
    {0, NULL},
};

static PyType_Spec dispatch_spec = {"tilebin.runtime._hot.Dispatch", sizeof(Dispatch), 0, Py_TPFLAGS_DEFAULT,
                                    dispatch_slots};

/* Front(registry_cell, slow): tilebin.runtime.launch is its launch method (METH_FASTCALL: no argument
 * tuple; front(...) is the same call).  front.launch(name, *args, stream=None) finds the
 * kernel's Dispatch (registry_cell[0]._entries[name].launch; the last FRONT_NAMES name objects found for
 * the current registry are remembered, compared by identity) and runs it with no Python frame; any other
 * call (keywords besides stream, no registry yet, an unknown name, a Python-path entry) is
 * slow(name, *args, **kwargs), the Python function with the same contract. */
#define FRONT_NAMES 8 /* kernel names whose Dispatch a Front remembers (for the registry it last served) */
typedef struct {
    PyObject_HEAD
    PyObject *cell, *slow;
    PyObject *reg;                  /* the registry the names below belong to (held: its id cannot be reused) */
    PyObject *name[FRONT_NAMES], *dispatch[FRONT_NAMES];
    int next;
} Front;

static PyObject *s_entries, *s_launchattr, *s_streamkw, *dispatch_type;

static int front_init(PyObject *self, PyObject *args, PyObject *kw) {
    Front *f = (Front *)self;
    PyObject *cell, *slow;
    if (f->slow != NULL) {
        PyErr_SetString(PyExc_TypeError, "_hot.Front is initialised once");
        return -1;
    }
    if (!PyArg_ParseTuple(args, "O!O", &PyList_Type, &cell, &slow)) return -1;
    Py_INCREF(cell), Py_INCREF(slow);
    f->cell = cell, f->slow = slow;
    return 0;
}

static void front_dealloc(PyObject *self) {
    Front *f = (Front *)self;
    PyTypeObject *tp = Py_TYPE(self);
    Py_XDECREF(f->cell), Py_XDECREF(f->slow), Py_XDECREF(f->reg);
    for (int i = 0; i < FRONT_NAMES; i++) Py_XDECREF(f->name[i]), Py_XDECREF(f->dispatch[i]);
    ((freefunc)PyType_GetSlot(tp, Py_tp_free))(self);
    Py_DECREF(tp);
}

/* Remember that `name` of registry `reg` is served by Dispatch `d` (a registry's entry for a name is
 * created once and never replaced, and an entry's Dispatch is fixed at its creation).  The new values
 * are stored before the old ones are released: a destructor running Python code sees a whole table. */
static void front_remember(Front *f, PyObject *reg, PyObject *name, PyObject *d) {
    PyObject *old[2 * FRONT_NAMES + 1] = {NULL};
    int n = 0;
    if (f->reg != reg) {
        old[n++] = f->reg;
        for (int i = 0; i < FRONT_NAMES; i++) {
            old[n++] = f->name[i], old[n++] = f->dispatch[i];
            f->name[i] = f->dispatch[i] = NULL;
        }
        Py_INCREF(reg);
        f->reg = reg, f->next = 0;
    } else {
        old[n++] = f->name[f->next], old[n++] = f->dispatch[f->next];
    }
    Py_INCREF(name), Py_INCREF(d);
    f->name[f->next] = name, f->dispatch[f->next] = d;
    f->next = (f->next + 1) % FRONT_NAMES;
    for (int i = 0; i < n; i++) Py_XDECREF(old[i]);
}

/* The Dispatch serving kernel `name` (a new reference), or NULL (no exception) when there is none. */
static PyObject *front_dispatch(Front *f, PyObject *name) {
    PyObject *reg = PyList_Size(f->cell) ? PyList_GetItem(f->cell, 0) : NULL, *d = NULL;
    if (reg && reg == f->reg)
        for (int i = 0; i < FRONT_NAMES; i++)
            if (f->name[i] == name) { /* the same name object: no lookups */
                Py_INCREF(f->dispatch[i]);
                return f->dispatch[i];
            }
    PyObject *entries = (reg && reg != Py_None) ? PyObject_GetAttr(reg, s_entries) : NULL;
    PyObject *entry = (entries && PyDict_Check(entries)) ? PyDict_GetItemWithError(entries, name) : NULL;
    if (entry) d = PyObject_GetAttr(entry, s_launchattr); /* entry is borrowed from entries, still held */
    Py_XDECREF(entries);
    if (d && (PyObject *)Py_TYPE(d) != dispatch_type) Py_CLEAR(d);
    PyErr_Clear();
    if (d && PyUnicode_CheckExact(name)) front_remember(f, reg, name, d);
    return d;
}

/* front.launch(name, *args, stream=None, **kwargs) (METH_FASTCALL: no argument tuple is made): a known
 * name with no keywords but `stream` runs its Dispatch; anything else is slow(name, *args, **kwargs). */
static PyObject *front_launch(PyObject *self, PyObject *const *args, Py_ssize_t nargs, PyObject *kwnames) {
    Front *f = (Front *)self;
    PyObject *stream = Py_None, *d = NULL, *t, *kw = NULL, *r = NULL;
    Py_ssize_t nkw = kwnames ? PyTuple_Size(kwnames) : 0;
    if (f->slow == NULL) {
        PyErr_SetString(PyExc_TypeError, "_hot.Front was not initialised");
        return NULL;
    }
    if (nkw == 1) {
        PyObject *name = PyTuple_GetItem(kwnames, 0);
        if (name == s_streamkw || PyUnicode_Compare(name, s_streamkw) == 0) stream = args[nargs];
        else nkw = -1; /* another keyword: the slow path */
    }
    if (nargs >= 1 && nkw >= 0 && nkw <= 1) d = front_dispatch(f, args[0]);
    if (d != NULL) {
        r = dispatch_run((Dispatch *)d, args + 1, nargs - 1, NULL, NULL, stream);
        Py_DECREF(d);
        return r;
    }
    if ((t = tuple_of(args, nargs)) == NULL) return NULL;
    nkw = kwnames ? PyTuple_Size(kwnames) : 0;
    if (nkw && (kw = PyDict_New()) != NULL)
        for (Py_ssize_t i = 0; i < nkw; i++)
            if (PyDict_SetItem(kw, PyTuple_GetItem(kwnames, i), args[nargs + i])) Py_CLEAR(kw);
    if (nkw == 0 || kw != NULL) r = PyObject_Call(f->slow, t, kw);
    Py_DECREF(t);
    Py_XDECREF(kw);
    return r;
}

/* front(name, *args, stream=None, **kwargs): the same call as front.launch. */
static PyObject *front_call(PyObject *self, PyObject *args, PyObject *kw) {
    Front *f = (Front *)self;
    PyObject *stream = Py_None, *d = NULL, *r = NULL, *av[MAXP + 1];
    Py_ssize_t n = PyTuple_Size(args), nkw = kw ? PyDict_Size(kw) : 0;
    if (nkw == 1 && (stream = PyDict_GetItemWithError(kw, s_streamkw)) == NULL) PyErr_Clear();
    if (f->slow && n >= 1 && n <= MAXP + 1 && (nkw == 0 || (nkw == 1 && stream != NULL)))
        d = front_dispatch(f, PyTuple_GetItem(args, 0));
    if (d == NULL) {
        if (f->slow == NULL) PyErr_SetString(PyExc_TypeError, "_hot.Front was not initialised");
        return f->slow ? PyObject_Call(f->slow, args, kw) : NULL;
    }
    for (Py_ssize_t i = 0; i < n; i++) av[i] = PyTuple_GetItem(args, i);
    r = dispatch_run((Dispatch *)d, av + 1, n - 1, NULL, NULL, stream);
    Py_DECREF(d);
    return r;
}

static PyMethodDef front_methods[] = {
    {"launch", (PyCFunction)(void (*)(void))front_launch, METH_FASTCALL | METH_KEYWORDS,
     "launch(name, *args, stream=None, **kwargs): launch kernel `name` from the default registry, validated once "
     "per call signature; see tilebin.runtime.Registry.launch for the contract (tilebin.runtime.launch is this "
     "method of the compiled front: a plan-cache hit runs with no Python frame and no argument tuple; anything "
     "else is tilebin.runtime._launch_python, which has the same behaviour)."},
    {NULL, NULL, 0, NULL},
};

static PyType_Slot front_slots[] = {
    {Py_tp_init, front_init},
    {Py_tp_dealloc, front_dealloc},
    {Py_tp_call, front_call},
    {Py_tp_methods, front_methods},
    {Py_tp_doc, "launch(name, *args, stream=None, **kwargs): launch kernel `name` from the default registry, "
                "validated once per call signature; see tilebin.runtime.Registry.launch for the contract "
                "(the compiled front of tilebin.runtime._launch_python, which has the same behaviour)."},
    {0, NULL},
};

static PyType_Spec front_spec = {"tilebin.runtime._hot.Front", sizeof(Front), 0, Py_TPFLAGS_DEFAULT, front_slots};

/* _hot.single_device(flag): whether the driver sees exactly one CUDA device (recent signatures then
 * skip each tensor's get_device(): its ordinal can only be 0).  Returns the previous value. */
static PyObject *set_single_device(PyObject *module, PyObject *flag) {
    int v = PyObject_IsTrue(flag), old = one_device;
    if (v < 0) return NULL;
    one_device = v;
    return PyBool_FromLong(old);
}

static PyMethodDef module_methods[] = {
    {"single_device", set_single_device, METH_O,
     "single_device(flag): the driver sees exactly one CUDA device (set by the registry; returns the old value)"},
    {NULL, NULL, 0, NULL},
};

/* Module init: the Front type (after Dispatch, whose type it recognises). */
static int add_front(PyObject *m, PyObject *dispatch) {
    PyObject *tp;
    if (!(s_entries = PyUnicode_InternFromString("_entries")) ||
        !(s_launchattr = PyUnicode_InternFromString("launch")) || !(s_streamkw = PyUnicode_InternFromString("stream")))
        return -1;
    Py_INCREF(dispatch);
    dispatch_type = dispatch;
    if ((tp = PyType_FromSpec(&front_spec)) == NULL) return -1;
    if (PyModule_AddFunctions(m, module_methods) || PyModule_AddObject(m, "Front", tp)) {
        Py_DECREF(tp);
        return -1;
    }
    return 0;
}
