/* The relay's receiving end in C: kinspect.proxy.receiving.Receiver (the reference) as a type.
 *
 * The event loop calls a buffered protocol's get_buffer and buffer_updated for every read. As
 * Python methods they cost a relay of one small request at a time about a tenth more CPU than
 * uvloop's own reads into bytes (bench_proxy.py --small-only); here they are a return and one call.
 *
 * Slab(size): what a thread's reads land in, shared by every Receiver of the thread (one event loop
 * a thread: one read at a time). It exports, as a writable buffer, a bytes object of `size` bytes
 * that is its alone (the spare), made when a read needs it.
 * Receiver(callback, slab): get_buffer(sizehint) returns the slab; buffer_updated(n) hands callback
 * the n bytes read as bytes. A read of COPY_BELOW bytes or more is the spare itself, cut to n (the
 * next read gets a new spare): the bytes the kernel wrote are the bytes forwarded, never copied in
 * user space. A smaller read is copied out, and the spare kept. Why: with a consumer's megabyte
 * reads, the copy of each read into bytes was a tenth of the proxy's CPU (perf: memmove 9.7%), and it
 * ran over a megabyte that had just left the cache to a megabyte not yet in it. glibc's realloc cuts a
 * heap block in place, and the proxy keeps such blocks on the heap (kinspect.proxy.allocator). */

#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <structmember.h>

/* Reads at least this long are handed on as the spare itself; shorter ones are copied out of it. */
#define COPY_BELOW (32 * 1024)

/* ------------------------------------------------------------------ Slab */

typedef struct {
    PyObject_HEAD
    PyObject *spare;   /* a bytes of `size` bytes no one else holds, or NULL until a read needs one */
    Py_ssize_t size;
    Py_ssize_t exports; /* buffers of the slab not yet released (the event loop's, during a read) */
} SlabObject;

static int slab_init(SlabObject *self, PyObject *args, PyObject *kwargs)
{
    Py_ssize_t size;
    static char *names[] = {"size", NULL};
    if (!PyArg_ParseTupleAndKeywords(args, kwargs, "n:Slab", names, &size))
        return -1;
    if (size <= 0) {
        PyErr_SetString(PyExc_ValueError, "Slab: size must be above zero");
        return -1;
    }
    if (self->exports) {
        PyErr_SetString(PyExc_BufferError, "Slab: its buffer is exported");
        return -1;
    }
    Py_CLEAR(self->spare);
    self->size = size;
    return 0;
}

/* The spare, made if there is none (borrowed); NULL with an error set. */
static PyObject *slab_spare(SlabObject *self)
{
    if (self->spare == NULL) {
        if (self->size <= 0) {
            PyErr_SetString(PyExc_RuntimeError, "Slab: not initialized");
            return NULL;
        }
        self->spare = PyBytes_FromStringAndSize(NULL, self->size);
    }
    return self->spare;
}

static int slab_getbuffer(SlabObject *self, Py_buffer *view, int flags)
{
    PyObject *spare = slab_spare(self);
    if (spare == NULL) {
        view->obj = NULL;
        return -1;
    }
    if (PyBuffer_FillInfo(view, (PyObject *)self, PyBytes_AS_STRING(spare), self->size, 0, flags) < 0)
        return -1;
    self->exports++;
    return 0;
}

static void slab_releasebuffer(SlabObject *self, Py_buffer *view)
{
    self->exports--; /* the view's address may be a spare handed on since: it is not read */
}

/* The n bytes read into the spare, as bytes (new reference): the spare itself, cut to n, when the read is
 * long and nobody else holds the slab's buffer (who could write into it after), else a copy. */
static PyObject *slab_take(SlabObject *self, Py_ssize_t n)
{
    PyObject *spare = slab_spare(self);
    if (spare == NULL)
        return NULL;
    if (n < COPY_BELOW || self->exports > 1 || Py_REFCNT(spare) != 1)
        return PyBytes_FromStringAndSize(PyBytes_AS_STRING(spare), n);
    self->spare = NULL;
    if (_PyBytes_Resize(&spare, n) < 0) /* frees it on failure */
        return NULL;
    return spare;
}

static void slab_dealloc(SlabObject *self)
{
    Py_CLEAR(self->spare);
    Py_TYPE(self)->tp_free((PyObject *)self);
}

static PyObject *slab_get_spare(SlabObject *self, void *closure)
{
    return Py_NewRef(self->spare != NULL ? self->spare : Py_None);
}

static PyGetSetDef slab_getset[] = {
    {"spare", (getter)slab_get_spare, NULL, "the bytes the next read lands in (None until one is needed)", NULL},
    {NULL, NULL, NULL, NULL, NULL},
};

static PyMemberDef slab_members[] = {
    {"size", T_PYSSIZET, offsetof(SlabObject, size), READONLY, "the most one read can be"},
    {"exports", T_PYSSIZET, offsetof(SlabObject, exports), READONLY, "buffers of the slab not yet released"},
    {NULL, 0, 0, 0, NULL},
};

static Py_ssize_t slab_length(SlabObject *self)
{
    return self->size; /* asyncio's own loop asks len() of a buffered protocol's buffer */
}

static PySequenceMethods slab_as_sequence = {.sq_length = (lenfunc)slab_length};

static PyBufferProcs slab_as_buffer = {(getbufferproc)slab_getbuffer, (releasebufferproc)slab_releasebuffer};

static PyTypeObject SlabType = {
    PyVarObject_HEAD_INIT(NULL, 0)
    .tp_name = "kinspect.proxy._receive.Slab",
    .tp_basicsize = sizeof(SlabObject),
    .tp_flags = Py_TPFLAGS_DEFAULT,
    .tp_doc = "Slab(size): the writable buffer a thread's reads land in: a bytes object of its own, handed on by "
              "the Receiver that reads into it",
    .tp_new = PyType_GenericNew,
    .tp_init = (initproc)slab_init,
    .tp_dealloc = (destructor)slab_dealloc,
    .tp_as_buffer = &slab_as_buffer,
    .tp_as_sequence = &slab_as_sequence,
    .tp_getset = slab_getset,
    .tp_members = slab_members,
};

/* ------------------------------------------------------------------ Receiver */

typedef struct {
    PyObject_HEAD
    PyObject *callback;
    PyObject *buffer; /* the thread's Slab */
} ReceiverObject;

static int receiver_init(ReceiverObject *self, PyObject *args, PyObject *kwargs)
{
    PyObject *callback, *buffer;
    static char *names[] = {"callback", "buffer", NULL};
    if (!PyArg_ParseTupleAndKeywords(args, kwargs, "OO!:Receiver", names, &callback, &SlabType, &buffer))
        return -1;
    if (!PyCallable_Check(callback)) {
        PyErr_SetString(PyExc_TypeError, "Receiver: callback must be callable");
        return -1;
    }
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
    if (self->callback == NULL || self->buffer == NULL) {
        PyErr_SetString(PyExc_RuntimeError, "Receiver: not initialized");
        return NULL;
    }
    SlabObject *slab = (SlabObject *)self->buffer;
    if (n < 0 || n > slab->size) {
        PyErr_Format(PyExc_ValueError, "Receiver: %zd bytes read into a buffer of %zd", n, slab->size);
        return NULL;
    }
    if (n == 0) /* no read: nothing to hand on */
        Py_RETURN_NONE;
    PyObject *data = slab_take(slab, n);
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
     "get_buffer(sizehint) -> the thread's Slab to read into (its whole size, whatever the hint)"},
    {"buffer_updated", (PyCFunction)receiver_buffer_updated, METH_O,
     "buffer_updated(n): hands the callback the n bytes read, as bytes (none for 0)"},
    {NULL, NULL, 0, NULL},
};

static PyMemberDef receiver_members[] = {
    {"callback", T_OBJECT, offsetof(ReceiverObject, callback), READONLY, "what each read's bytes are handed to"},
    {"buffer", T_OBJECT, offsetof(ReceiverObject, buffer), READONLY, "the Slab every read goes into"},
    {NULL, 0, 0, 0, NULL},
};

static PyTypeObject ReceiverType = {
    PyVarObject_HEAD_INIT(NULL, 0)
    .tp_name = "kinspect.proxy._receive.Receiver",
    .tp_basicsize = sizeof(ReceiverObject),
    .tp_flags = Py_TPFLAGS_DEFAULT | Py_TPFLAGS_HAVE_GC,
    .tp_doc = "Receiver(callback, slab): a buffered protocol's get_buffer and buffer_updated, reads handed on as bytes",
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
    if (PyType_Ready(&SlabType) < 0 || PyType_Ready(&ReceiverType) < 0)
        return NULL;
    PyObject *module = PyModule_Create(&module_def);
    if (module == NULL)
        return NULL;
    if (PyModule_AddObjectRef(module, "Receiver", (PyObject *)&ReceiverType) < 0
        || PyModule_AddObjectRef(module, "Slab", (PyObject *)&SlabType) < 0
        || PyModule_AddIntConstant(module, "COPY_BELOW", COPY_BELOW) < 0) {
        Py_DECREF(module);
        return NULL;
    }
    return module;
}
