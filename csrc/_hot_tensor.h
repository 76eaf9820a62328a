/* _hot.c, part 0: torch tensors read through torch's stable C shim (no torch headers, nothing linked).
 *
 * Reading a tensor through its Python accessors (dtype, is_cuda, shape, stride(), data_ptr(),
 * get_device()) costs 50-150 ns each on the H200's host; a launch reads several per tensor.  torch
 * exports a C ABI that it keeps stable across versions for AOTInductor (aoti_torch_get_sizes,
 * aoti_torch_get_data_ptr, ...: torch/csrc/inductor/aoti_torch/c/shim.h), taking an at::Tensor*.
 *
 * tensor_abi(entries, tensor_type, probes, gpu_type) sets it up, once per process (runtime/_tensors.py):
 *   1. the shim's entry points (aoti_torch_get_dim, _sizes, _strides, _data_ptr, _dtype, _device_type,
 *      _device_index), resolved by the caller in the libtorch_cpu the process has loaded: nothing is
 *      linked at build time;
 *   2. where a tensor object holds its at::Tensor: the word that equals t._cdata (the TensorImpl
 *      address an at::Tensor consists of), the same offset in every probe;
 *   3. every probe's dim, sizes, strides, data pointer, dtype and device as the shim reads them,
 *      against what the Python accessors read (given in the probe); one mismatch turns it off.
 * It returns None (on) or why it is off.  Then tensor_handle(x) is x's at::Tensor* for an object of
 * exactly tensor_type (a subclass may override any accessor: it reads through Python), and a shim
 * call that fails (non-zero) makes the caller read through Python as before.
 */
typedef int32_t (*shim_i32_fn)(void *, int32_t *);
typedef int32_t (*shim_i64_fn)(void *, int64_t *);
typedef int32_t (*shim_i64p_fn)(void *, int64_t **);
typedef int32_t (*shim_ptr_fn)(void *, void **);
#define TABI_DTYPES 64

static struct {
    int on;
    Py_ssize_t offset; /* where an object of `type` holds its at::Tensor */
    PyObject *type;    /* torch.Tensor (strong reference while on) */
    int32_t gpu_type;  /* the c10::DeviceType counted as the GPU (CUDA: 1) */
    shim_i64_fn dim;
    shim_i64p_fn sizes, strides;
    shim_ptr_fn data_ptr;
    shim_i32_fn dtype, device_type, device_index;
    int ndtype;
    int32_t dtype_code[TABI_DTYPES];
    PyObject *dtype_obj[TABI_DTYPES]; /* strong references */
} tabi;

static void *tensor_handle(PyObject *x) {
    return tabi.on && (PyObject *)Py_TYPE(x) == tabi.type ? (void *)((char *)x + tabi.offset) : NULL;
}

/* The torch.dtype object of shim dtype `code` (borrowed), or NULL when no probe had that dtype. */
static PyObject *tabi_dtype(int32_t code) {
    for (int i = 0; i < tabi.ndtype; i++)
        if (tabi.dtype_code[i] == code) return tabi.dtype_obj[i];
    return NULL;
}

/* h's GPU ordinal in *out (-1: on another device type; a CUDA tensor always has an index, the CPU
 * that the tests count as the GPU has none: 0); 0, or BAIL. */
static int tabi_ordinal(void *h, long *out) {
    int32_t type, index;
    if (tabi.device_type(h, &type) || tabi.device_index(h, &index)) return BAIL;
    *out = type != tabi.gpu_type ? -1 : index < 0 ? 0 : (long)index;
    return 0;
}

/* What a launch or an op's key reads of a tensor: rank, sizes, strides, dtype code and GPU ordinal. */
typedef struct {
    int64_t ndim, *sizes, *strides;
    int32_t code;
    long ordinal;
} TensorRead;

static int tabi_read(void *h, TensorRead *r) { /* 0, or BAIL (a shim call failed) */
    return tabi.dim(h, &r->ndim) || tabi.sizes(h, &r->sizes) || tabi.strides(h, &r->strides) ||
                   tabi.dtype(h, &r->code) || tabi_ordinal(h, &r->ordinal)
               ? BAIL
               : 0;
}

static void tabi_off(void) {
    tabi.on = 0;
    Py_CLEAR(tabi.type);
    for (int i = 0; i < tabi.ndtype; i++) Py_CLEAR(tabi.dtype_obj[i]);
    tabi.ndtype = 0;
}

/* The shim's seven entry points (addresses resolved by runtime/_tensors.py with ctypes: nothing here links
 * libdl or torch); 0, or -1 when one is missing. */
static int tabi_entries(PyObject *entries) {
    void *fn[7];
    if (!PyTuple_Check(entries) || PyTuple_Size(entries) != 7) return -1;
    for (int i = 0; i < 7; i++) {
        long long v;
        if (as_int(entries, i, &v) || v == 0) return -1;
        fn[i] = (void *)(intptr_t)v;
    }
    tabi.dim = (shim_i64_fn)fn[0], tabi.sizes = (shim_i64p_fn)fn[1], tabi.strides = (shim_i64p_fn)fn[2];
    tabi.data_ptr = (shim_ptr_fn)fn[3], tabi.dtype = (shim_i32_fn)fn[4];
    tabi.device_type = (shim_i32_fn)fn[5], tabi.device_index = (shim_i32_fn)fn[6];
    return 0;
}

/* The offset of the word equal to `cdata` in x (a tensor object of `size` bytes), or -1. */
static Py_ssize_t tabi_find(PyObject *x, uint64_t cdata, Py_ssize_t size) {
    for (Py_ssize_t off = (Py_ssize_t)sizeof(PyObject); off + 8 <= size; off += 8) {
        uint64_t word;
        memcpy(&word, (char *)x + off, 8);
        if (word == cdata) return off;
    }
    return -1;
}

/* A probe: (tensor, cdata, dim, sizes, strides, data_ptr, dtype, device_type, device_index); NULL if it agrees. */
static const char *tabi_check(PyObject *probe, Py_ssize_t size) {
    PyObject *x = PyTuple_GetItem(probe, 0), *want_sizes = PyTuple_GetItem(probe, 3);
    PyObject *want_strides = PyTuple_GetItem(probe, 4), *dtype = PyTuple_GetItem(probe, 6);
    long long cdata, dim, ptr, dev_type, dev_index;
    if (as_int(probe, 1, &cdata) || as_int(probe, 2, &dim) || as_int(probe, 5, &ptr) ||
        as_int(probe, 7, &dev_type) || as_int(probe, 8, &dev_index))
        return "a probe is not (tensor, cdata, dim, sizes, strides, data_ptr, dtype, device type, index)";
    Py_ssize_t off = tabi_find(x, (uint64_t)cdata, size);
    if (off < 0 || (tabi.offset && off != tabi.offset)) return "no one place holds the at::Tensor in every probe";
    tabi.offset = off;
    void *h = (char *)x + off, *data;
    int64_t ndim, *sizes, *strides;
    int32_t code, type, index;
    if (tabi.dim(h, &ndim) || tabi.sizes(h, &sizes) || tabi.strides(h, &strides) || tabi.data_ptr(h, &data) ||
        tabi.dtype(h, &code) || tabi.device_type(h, &type) || tabi.device_index(h, &index))
        return "a shim call failed on a probe";
    if (ndim != dim || PyTuple_Size(want_sizes) != ndim || PyTuple_Size(want_strides) != ndim)
        return "the shim's dim differs from the tensor's";
    for (int64_t d = 0; d < ndim; d++) {
        long long s, t;
        if (as_int(want_sizes, d, &s) || as_int(want_strides, d, &t)) return "a probe's sizes are not ints";
        if (s != sizes[d] || t != strides[d]) return "the shim's sizes or strides differ from the tensor's";
    }
    if ((uint64_t)(uintptr_t)data != (uint64_t)ptr) return "the shim's data pointer differs from the tensor's";
    if (type != dev_type || index != dev_index) return "the shim's device differs from the tensor's";
    PyObject *known = tabi_dtype(code);
    if (known != NULL) return known == dtype ? NULL : "two dtypes share a shim code";
    for (int i = 0; i < tabi.ndtype; i++)
        if (tabi.dtype_obj[i] == dtype) return "one dtype has two shim codes";
    if (tabi.ndtype == TABI_DTYPES) return "too many dtypes";
    Py_INCREF(dtype);
    tabi.dtype_code[tabi.ndtype] = code, tabi.dtype_obj[tabi.ndtype++] = dtype;
    return NULL;
}

/* tensor_abi(entries, tensor_type, probes, gpu_type) -> None (on) or why it is off; tensor_abi(None) turns it off. */
static PyObject *tensor_abi(PyObject *self, PyObject *args) {
    const char *why = NULL;
    PyObject *entries, *type = NULL, *probes = NULL;
    int gpu_type = 1;
    if (!PyArg_ParseTuple(args, "O|OO!i", &entries, &type, &PyTuple_Type, &probes, &gpu_type)) return NULL;
    tabi_off();
    if (entries == Py_None) Py_RETURN_NONE;
    if (type == NULL || probes == NULL || !PyType_Check(type) || PyTuple_Size(probes) == 0) {
        PyErr_SetString(PyExc_TypeError, "tensor_abi(entries, tensor_type, probes, gpu_type)");
        return NULL;
    }
    if (tabi_entries(entries)) {
        PyErr_Clear();
        return PyUnicode_FromString("the shim's entry points are not seven non-zero addresses");
    }
    PyObject *basic = PyObject_GetAttrString(type, "__basicsize__"); /* (tp_basicsize: not in the limited API) */
    Py_ssize_t size = basic ? PyLong_AsSsize_t(basic) : -1;
    Py_XDECREF(basic);
    if (size < 0) return NULL;
    tabi.offset = 0;
    for (Py_ssize_t i = 0; why == NULL && i < PyTuple_Size(probes); i++) {
        PyObject *p = PyTuple_GetItem(probes, i);
        if (!PyTuple_Check(p) || PyTuple_Size(p) != 9 || (PyObject *)Py_TYPE(PyTuple_GetItem(p, 0)) != type)
            why = "a probe is not (tensor, cdata, ...) of the tensor type";
        else
            why = tabi_check(p, size);
    }
    if (PyErr_Occurred()) {
        tabi_off();
        return NULL;
    }
    if (why != NULL) {
        tabi_off();
        return PyUnicode_FromString(why);
    }
    Py_INCREF(type);
    tabi.type = type, tabi.gpu_type = gpu_type, tabi.on = 1;
    Py_RETURN_NONE;
}

/* tensor_facts(x) -> (dim, sizes, strides, data_ptr, dtype, ordinal) as the shim reads them, or None
 * when x is not read through it (for tests; ordinal -1 off the GPU). */
static PyObject *tensor_facts(PyObject *self, PyObject *x) {
    void *h = tensor_handle(x), *data;
    TensorRead v;
    if (h == NULL || tabi_read(h, &v) || tabi.data_ptr(h, &data) || tabi_dtype(v.code) == NULL) Py_RETURN_NONE;
    PyObject *s = PyTuple_New(v.ndim), *t = PyTuple_New(v.ndim);
    for (int64_t d = 0; s && t && d < v.ndim; d++) {
        PyTuple_SetItem(s, d, PyLong_FromLongLong(v.sizes[d]));
        PyTuple_SetItem(t, d, PyLong_FromLongLong(v.strides[d]));
    }
    PyObject *r = s && t ? Py_BuildValue("(LOOKOl)", (long long)v.ndim, s, t, (unsigned long long)(uintptr_t)data,
                                         tabi_dtype(v.code), v.ordinal)
                         : NULL;
    Py_XDECREF(s), Py_XDECREF(t);
    return r;
}

static PyMethodDef tensor_methods[] = {
    {"tensor_abi", tensor_abi, METH_VARARGS,
     "tensor_abi(entries, tensor_type, probes, gpu_type=1): read tensors through torch's stable C shim "
     "(csrc/_hot_tensor.h); None when on, else why not; tensor_abi(None) turns it off"},
    {"tensor_facts", tensor_facts, METH_O, "tensor_facts(x): what the shim reads of x (tests), or None"},
    {NULL, NULL, 0, NULL},
};
