/* The relay's receiving end in C: kinspect.proxy.receiving.Receiver (the reference) as a type.
 *
 * The event loop calls a buffered protocol's get_buffer and buffer_updated for every read. As
 * Python methods they cost a relay of one small request at a time about a tenth more CPU than
 * uvloop's own reads into bytes (bench_proxy.py --small-only); here they are a return and a
 * copy into bytes with one call.
 *
 * Receiver(callback, buffer): get_buffer(sizehint) returns buffer (a writable buffer, shared by
 * every Receiver of a thread); buffer_updated(n) hands callback the bytes of buffer[:n]. */

#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <structmember.h>

typedef struct {
    PyObject_HEAD
    PyObject *callback;
    PyObject *buffer;
    Py_buffer view; /* the buffer's, held while the Receiver lives: its address never changes */
} ReceiverObject;

static int receiver_init(ReceiverObject *self, PyObject *args, PyObject *kwargs)
{
    PyObject *callback, *buffer;
    static char *names[] = {"callback", "buffer", NULL};
    if (!PyArg_ParseTupleAndKeywords(args, kwargs, "OO:Receiver", names, &callback, &buffer))
        return -1;
    if (!PyCallable_Check(callback)) {
        PyErr_SetString(PyExc_TypeError, "Receiver: callback must be callable");
        return -1;
    }
    Py_buffer view;
    if (PyObject_GetBuffer(buffer, &view, PyBUF_WRITABLE) < 0)
        return -1;
    if (self->view.obj != NULL)
        PyBuffer_Release(&self->view);
    self->view = view;
    Py_XSETREF(self->callback, Py_NewRef(callback));
    Py_XSETREF(self->buffer, Py_NewRef(buffer));
    return 0;
}

static int receiver_traverse(ReceiverObject *self, visitproc visit, void *arg)
{
    Py_VISIT(self->callback);
    Py_VISIT(self->buffer);
    return 0;
}

static int receiver_clear(ReceiverObject *self)
{
    Py_CLEAR(self->callback);
    return 0;
}

static void receiver_dealloc(ReceiverObject *self)
{
    PyObject_GC_UnTrack(self);
    if (self->view.obj != NULL)
        PyBuffer_Release(&self->view);
    Py_CLEAR(self->callback);
    Py_CLEAR(self->buffer);
    Py_TYPE(self)->tp_free((PyObject *)self);
}

static PyObject *receiver_get_buffer(ReceiverObject *self, PyObject *sizehint)
{
    if (self->buffer == NULL) {
        PyErr_SetString(PyExc_RuntimeError, "Receiver: not initialized");
        return NULL;
    }
    return Py_NewRef(self->buffer);
}

static PyObject *receiver_buffer_updated(ReceiverObject *self, PyObject *arg)
{
    Py_ssize_t n = PyLong_AsSsize_t(arg);
    if (n == -1 && PyErr_Occurred())
        return NULL;
    if (self->callback == NULL || self->view.obj == NULL) {
        PyErr_SetString(PyExc_RuntimeError, "Receiver: not initialized");
        return NULL;
    }
    if (n < 0 || n > self->view.len) {
        PyErr_Format(PyExc_ValueError, "Receiver: %zd bytes read into a buffer of %zd", n, self->view.len);
        return NULL;
    }
    if (n == 0) /* no read: nothing to hand on */
        Py_RETURN_NONE;
    PyObject *data = PyBytes_FromStringAndSize(self->view.buf, n);
    if (data == NULL)
        return NULL;
    PyObject *out = PyObject_CallOneArg(self->callback, data);
    Py_DECREF(data);
    if (out == NULL)
        return NULL;
    Py_DECREF(out);
    Py_RETURN_NONE;
}

static PyMethodDef receiver_methods[] = {
    {"get_buffer", (PyCFunction)receiver_get_buffer, METH_O,
     "get_buffer(sizehint) -> the shared buffer to read into (its whole length, whatever the hint)"},
    {"buffer_updated", (PyCFunction)receiver_buffer_updated, METH_O,
     "buffer_updated(n): hands the callback the bytes of buffer[:n] (none for 0)"},
    {NULL, NULL, 0, NULL},
};

static PyMemberDef receiver_members[] = {
    {"callback", T_OBJECT, offsetof(ReceiverObject, callback), READONLY, "what each read's bytes are handed to"},
    {"buffer", T_OBJECT, offsetof(ReceiverObject, buffer), READONLY, "the buffer every read goes into"},
    {NULL, 0, 0, 0, NULL},
};

static PyTypeObject ReceiverType = {
    PyVarObject_HEAD_INIT(NULL, 0)
    .tp_name = "kinspect.proxy._receive.Receiver",
    .tp_basicsize = sizeof(ReceiverObject),
    .tp_flags = Py_TPFLAGS_DEFAULT | Py_TPFLAGS_HAVE_GC,
    .tp_doc = "Receiver(callback, buffer): a buffered protocol's get_buffer and buffer_updated, reads handed on as bytes",
    .tp_new = PyType_GenericNew,
    .tp_init = (initproc)receiver_init,
    .tp_dealloc = (destructor)receiver_dealloc,
    .tp_traverse = (traverseproc)receiver_traverse,
    .tp_clear = (inquiry)receiver_clear,
    .tp_methods = receiver_methods,
    .tp_members = receiver_members,
};

static struct PyModuleDef module_def = {
    PyModuleDef_HEAD_INIT, "kinspect.proxy._receive", "The relay's receiving end (kinspect.proxy.receiving) in C.", -1,
    NULL,
};

PyMODINIT_FUNC PyInit__receive(void)
{
    if (PyType_Ready(&ReceiverType) < 0)
        return NULL;
    PyObject *module = PyModule_Create(&module_def);
    if (module == NULL)
        return NULL;
    if (PyModule_AddObjectRef(module, "Receiver", (PyObject *)&ReceiverType) < 0) {
        Py_DECREF(module);
        return NULL;
    }
    return module;
}
