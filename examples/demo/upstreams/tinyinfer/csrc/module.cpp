// tinyinfer._C: the Python module (plain C API: no torch needed to import it).
#define PY_SSIZE_T_CLEAN
#include <Python.h>

static const int kKernelCount = 12;

static PyObject* kernel_count(PyObject*, PyObject*) { return PyLong_FromLong(kKernelCount); }

static PyObject* engine_name(PyObject*, PyObject*) { return PyUnicode_FromString("tinyinfer"); }

static PyMethodDef methods[] = {
    {"kernel_count", kernel_count, METH_NOARGS, "number of kernel families"},
    {"engine_name", engine_name, METH_NOARGS, "the engine's name"},
    {nullptr, nullptr, 0, nullptr},
};

static struct PyModuleDef module = {PyModuleDef_HEAD_INIT, "_C", nullptr, -1, methods};

PyMODINIT_FUNC PyInit__C(void) { return PyModule_Create(&module); }
