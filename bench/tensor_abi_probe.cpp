// What reading a tensor's metadata costs through torch's C++ API, for bench/probe_tensor_abi.py.
//
// Not part of the wheel: issue 10's remaining op host time is spent in torch's Python accessors
// (dtype, is_cuda, shape, is_contiguous(), data_ptr()).  This module reads the same facts through
// at::Tensor, so the benchmark can show what a torch-ABI component (built per torch version)
// would save.  facts(*tensors) reads, per tensor, what an op's memo key and per-call checks read;
// noop(*tensors) is the same call with nothing read (the call's own cost).
#include <Python.h>
#include <torch/csrc/autograd/python_variable.h>

static PyObject *facts(PyObject *, PyObject *const *args, Py_ssize_t n) {
    uint64_t acc = 0;
    for (Py_ssize_t i = 0; i < n; i++) {
        if (!THPVariable_Check(args[i])) {
            PyErr_SetString(PyExc_TypeError, "facts() takes tensors");
            return nullptr;
        }
        const at::Tensor &t = THPVariable_Unpack(args[i]);
        acc += static_cast<uint64_t>(t.scalar_type()) + t.is_cuda() + t.is_contiguous() + t.dim();
        for (int64_t v : t.sizes()) acc += static_cast<uint64_t>(v);
        for (int64_t v : t.strides()) acc += static_cast<uint64_t>(v);
        acc += reinterpret_cast<uintptr_t>(t.const_data_ptr());
    }
    return PyLong_FromUnsignedLongLong(acc);
}

static PyObject *noop(PyObject *, PyObject *const *, Py_ssize_t) { Py_RETURN_NONE; }

static PyMethodDef methods[] = {
    {"facts", reinterpret_cast<PyCFunction>(reinterpret_cast<void (*)()>(facts)), METH_FASTCALL,
     "dtype, device, rank, sizes, strides, contiguity and data pointer of each tensor"},
    {"noop", reinterpret_cast<PyCFunction>(reinterpret_cast<void (*)()>(noop)), METH_FASTCALL, "the call alone"},
    {nullptr, nullptr, 0, nullptr},
};

static PyModuleDef module = {PyModuleDef_HEAD_INIT, "tensor_abi_probe", nullptr, -1, methods};

PyMODINIT_FUNC PyInit_tensor_abi_probe(void) { return PyModule_Create(&module); }
