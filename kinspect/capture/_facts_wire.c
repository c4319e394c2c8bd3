/* A batch of capture facts as bytes for the writer process, encoded with the GIL released
 * (kinspect.capture.facts_wire is the reference, and describes the format).
 *
 * Why without the GIL: the proxy's writer thread pickled each batch holding the GIL, about 1 us a
 * row, and each time the event loop woke meanwhile it waited. The facts are immutable (tuples of
 * None, bools, ints, floats, strs, bytes) and the batch keeps every one alive: this encoder only
 * reads their type, size and contents, never a reference count (the one field the event loop may
 * write meanwhile), and calls no Python API between Py_BEGIN_ALLOW_THREADS and its end. Anything
 * it cannot read that way (another type, a subclass, an int beyond 64 bits, a str in the legacy
 * layout) makes it decline the batch, which the caller then pickles.
 *
 * encode(rows: list) -> bytes | None   the payload; None where it declines
 * write(fd, rows: list) -> bool        the payload as one message (4-byte big-endian length first),
 *                                      written to fd, the GIL released throughout; False, nothing
 *                                      written, where it declines; OSError if the write fails
 * decode(payload) -> list              the rows again (GIL held; ValueError on a bad payload) */

#define PY_SSIZE_T_CLEAN
#include <Python.h>

#include <errno.h>
#include <stdint.h>
#include <string.h>
#include <unistd.h>

#define MAGIC "KFW1"
#define MAX_DEPTH 32

enum { ENC_OK = 0, ENC_DECLINE = 1, ENC_NOMEM = 2 };

typedef struct {
    unsigned char *data;
    size_t len, cap;
    uintptr_t *keys; /* the memo: an object's address -> its number; 0 is an empty slot */
    uint32_t *numbers;
    size_t mask, count;
} Encoder;

static int reserve(Encoder *e, size_t more) {
    if (e->len + more <= e->cap) return ENC_OK;
    size_t cap = e->cap ? e->cap : 65536;
    while (cap < e->len + more) cap *= 2;
    unsigned char *data = PyMem_RawRealloc(e->data, cap);
    if (data == NULL) return ENC_NOMEM;
    e->data = data;
    e->cap = cap;
    return ENC_OK;
}

/* A tag and `width` bytes of x, little-endian. */
static int put_tag(Encoder *e, char tag, uint64_t x, int width) {
    int rc = reserve(e, 1 + (size_t)width);
    if (rc) return rc;
    unsigned char *p = e->data + e->len;
    p[0] = (unsigned char)tag;
    for (int i = 0; i < width; i++) p[1 + i] = (unsigned char)(x >> (8 * i));
    e->len += 1 + (size_t)width;
    return ENC_OK;
}

static int put_tag_u32(Encoder *e, char tag, size_t n) {
    return n > UINT32_MAX ? ENC_DECLINE : put_tag(e, tag, n, 4);
}

static int put_bytes(Encoder *e, const void *src, size_t n) {
    int rc = reserve(e, n);
    if (rc) return rc;
    memcpy(e->data + e->len, src, n);
    e->len += n;
    return ENC_OK;
}

static size_t slot_of(uintptr_t key, size_t mask) {
    return (size_t)(((uint64_t)(key >> 4) * 0x9E3779B97F4A7C15ull) >> 20) & mask;
}

/* The object's number if seen before (*found = 1), else numbers it. */
static int memo(Encoder *e, PyObject *v, uint32_t *number, int *found) {
    if ((e->count + 1) * 2 > e->mask + 1) {
        size_t cap = e->keys ? (e->mask + 1) * 2 : 4096;
        uintptr_t *keys = PyMem_RawCalloc(cap, sizeof(uintptr_t));
        uint32_t *numbers = PyMem_RawMalloc(cap * sizeof(uint32_t));
        if (keys == NULL || numbers == NULL) {
            PyMem_RawFree(keys);
            PyMem_RawFree(numbers);
            return ENC_NOMEM;
        }
        if (e->keys) {
            for (size_t i = 0; i <= e->mask; i++) {
                if (!e->keys[i]) continue;
                size_t s = slot_of(e->keys[i], cap - 1);
                while (keys[s]) s = (s + 1) & (cap - 1);
                keys[s] = e->keys[i];
                numbers[s] = e->numbers[i];
            }
        }
        PyMem_RawFree(e->keys);
        PyMem_RawFree(e->numbers);
        e->keys = keys;
        e->numbers = numbers;
        e->mask = cap - 1;
    }
    uintptr_t key = (uintptr_t)v;
    size_t s = slot_of(key, e->mask);
    while (e->keys[s]) {
        if (e->keys[s] == key) {
            *number = e->numbers[s];
            *found = 1;
            return ENC_OK;
        }
        s = (s + 1) & e->mask;
    }
    if (e->count >= UINT32_MAX) return ENC_DECLINE;
    e->keys[s] = key;
    e->numbers[s] = *number = (uint32_t)e->count++;
    *found = 0;
    return ENC_OK;
}

/* The value of n 30-bit digits (least significant first) and a sign; 0 where beyond 64 bits. */
static int int64_of_digits(const digit *d, size_t n, int negative, int64_t *out) {
    if (n > 3 || (n == 3 && d[2] >> (64 - 2 * PyLong_SHIFT))) return 0; /* more than 64 bits of magnitude */
    uint64_t mag = 0;
    for (size_t i = n; i-- > 0;) mag = (mag << PyLong_SHIFT) | d[i];
    if (mag > (uint64_t)INT64_MAX + (negative ? 1 : 0)) return 0;
    *out = negative ? (int64_t)(0 - mag) : (int64_t)mag;
    return 1;
}

/* An exact int's value, read from its fields; 0 where it is beyond 64 bits (or laid out in a way not known here). */
static int int64_of(PyObject *v, int64_t *out) {
#if PY_VERSION_HEX < 0x030C0000
    Py_ssize_t size = ((PyVarObject *)v)->ob_size; /* its sign is the int's */
    return int64_of_digits(((PyLongObject *)v)->ob_digit, (size_t)(size < 0 ? -size : size), size < 0, out);
#else
    const PyLongObject *l = (const PyLongObject *)v;
    if (PyUnstable_Long_IsCompact(l)) {
        *out = (int64_t)PyUnstable_Long_CompactValue(l);
        return 1;
    }
#if PY_VERSION_HEX < 0x030F0000
    /* 3.12-3.14: lv_tag holds the digit count above bit 3 and the sign in bits 0-1 (2: negative) */
    uintptr_t tag = l->long_value.lv_tag;
    return int64_of_digits(l->long_value.ob_digit, (size_t)(tag >> 3), (tag & 3) == 2, out);
#else
    return 0;
#endif
#endif
}

/* Called without the GIL: reads the objects' fields only (see the top of this file). */
static int encode_value(Encoder *e, PyObject *v, int depth) {
    if (v == Py_None) return put_bytes(e, "N", 1);
    if (v == Py_True) return put_bytes(e, "T", 1);
    if (v == Py_False) return put_bytes(e, "F", 1);
    PyTypeObject *type = Py_TYPE(v);
    if (type == &PyLong_Type) {
        int64_t x;
        if (!int64_of(v, &x)) return ENC_DECLINE;
        return put_tag(e, 'i', (uint64_t)x, 8);
    }
    if (type == &PyFloat_Type) {
        double d = PyFloat_AS_DOUBLE(v);
        uint64_t bits;
        memcpy(&bits, &d, 8);
        return put_tag(e, 'd', bits, 8);
    }
    if (type != &PyTuple_Type && type != &PyUnicode_Type && type != &PyBytes_Type) return ENC_DECLINE;
    if (type == &PyUnicode_Type && !PyUnicode_IS_COMPACT(v)) return ENC_DECLINE; /* before it is numbered */
    if (type == &PyTuple_Type && depth >= MAX_DEPTH) return ENC_DECLINE;
    uint32_t number;
    int found, rc = memo(e, v, &number, &found);
    if (rc) return rc;
    if (found) return put_tag_u32(e, 'r', number);
    if (type == &PyBytes_Type) {
        size_t n = (size_t)PyBytes_GET_SIZE(v);
        if ((rc = put_tag_u32(e, 'b', n))) return rc;
        return put_bytes(e, PyBytes_AS_STRING(v), n);
    }
    if (type == &PyUnicode_Type) {
        size_t n = (size_t)PyUnicode_GET_LENGTH(v);
        if (PyUnicode_IS_COMPACT_ASCII(v)) {
            if ((rc = put_tag_u32(e, 'a', n))) return rc;
            return put_bytes(e, PyUnicode_DATA(v), n);
        }
        int kind = PyUnicode_KIND(v);
#if PY_BIG_ENDIAN
        if (kind != PyUnicode_1BYTE_KIND) return ENC_DECLINE; /* the format's wide characters are little-endian */
#endif
        char tag = kind == PyUnicode_1BYTE_KIND ? '1' : kind == PyUnicode_2BYTE_KIND ? '2' : '4';
        if ((rc = put_tag_u32(e, tag, n))) return rc;
        return put_bytes(e, PyUnicode_DATA(v), n * (size_t)kind);
    }
    Py_ssize_t n = PyTuple_GET_SIZE(v);
    if ((rc = put_tag_u32(e, 't', (size_t)n))) return rc;
    for (Py_ssize_t i = 0; i < n; i++) {
        if ((rc = encode_value(e, PyTuple_GET_ITEM(v, i), depth + 1))) return rc;
    }
    return ENC_OK;
}

static void encoder_free(Encoder *e) {
    PyMem_RawFree(e->data);
    PyMem_RawFree(e->keys);
    PyMem_RawFree(e->numbers);
}

/* Encodes rows after `prefix` bytes left for the caller, the GIL released while it works. The rows' items
 * are held (new references) for that time, so that nothing the batch reaches can go away. */
static int encode_rows(Encoder *e, PyObject *rows, size_t prefix) {
    Py_ssize_t n = PyList_GET_SIZE(rows);
    if ((size_t)n > UINT32_MAX) return ENC_DECLINE;
    PyObject **items = PyMem_Malloc(sizeof(PyObject *) * (size_t)(n ? n : 1));
    if (items == NULL) return ENC_NOMEM;
    for (Py_ssize_t i = 0; i < n; i++) {
        items[i] = PyList_GET_ITEM(rows, i);
        Py_INCREF(items[i]);
    }
    int rc;
    Py_BEGIN_ALLOW_THREADS
    rc = reserve(e, prefix + 8);
    if (!rc) {
        e->len = prefix;
        memcpy(e->data + e->len, MAGIC, 4);
        for (int i = 0; i < 4; i++) e->data[e->len + 4 + i] = (unsigned char)((size_t)n >> (8 * i));
        e->len += 8;
        for (Py_ssize_t i = 0; i < n && !rc; i++) rc = encode_value(e, items[i], 0);
    }
    Py_END_ALLOW_THREADS
    for (Py_ssize_t i = 0; i < n; i++) Py_DECREF(items[i]);
    PyMem_Free(items);
    return rc;
}

static PyObject *fw_encode(PyObject *self, PyObject *rows) {
    if (!PyList_CheckExact(rows)) {
        PyErr_SetString(PyExc_TypeError, "encode takes a list of rows");
        return NULL;
    }
    Encoder e = {0};
    int rc = encode_rows(&e, rows, 0);
    PyObject *out = NULL;
    if (rc == ENC_OK) out = PyBytes_FromStringAndSize((const char *)e.data, (Py_ssize_t)e.len);
    else if (rc == ENC_DECLINE) out = Py_NewRef(Py_None);
    else PyErr_NoMemory();
    encoder_free(&e);
    return out;
}

static PyObject *fw_write(PyObject *self, PyObject *args) {
    int fd;
    PyObject *rows;
    if (!PyArg_ParseTuple(args, "iO!:write", &fd, &PyList_Type, &rows)) return NULL;
    Encoder e = {0};
    int rc = encode_rows(&e, rows, 4);
    if (rc == ENC_OK && e.len - 4 > UINT32_MAX) rc = ENC_DECLINE;
    if (rc != ENC_OK) {
        encoder_free(&e);
        if (rc == ENC_NOMEM) return PyErr_NoMemory();
        Py_RETURN_FALSE;
    }
    size_t payload = e.len - 4;
    for (int i = 0; i < 4; i++) e.data[i] = (unsigned char)(payload >> (8 * (3 - i)));
    int error = 0;
    Py_BEGIN_ALLOW_THREADS
    size_t done = 0;
    while (done < e.len) {
        ssize_t wrote = write(fd, e.data + done, e.len - done);
        if (wrote < 0) {
            if (errno == EINTR) continue; /* Python's handler only sets a flag; it runs once this returns */
            error = errno;
            break;
        }
        done += (size_t)wrote;
    }
    Py_END_ALLOW_THREADS
    encoder_free(&e);
    if (error) {
        errno = error;
        return PyErr_SetFromErrno(PyExc_OSError);
    }
    Py_RETURN_TRUE;
}

/* ------------------------------------------------------------------ decoding (the writer process) */

typedef struct {
    const unsigned char *p, *end, *start;
    PyObject **memo; /* owned references; NULL while a tuple is being decoded */
    size_t count, cap;
} Decoder;

static PyObject *bad(Decoder *d, const char *what) {
    PyErr_Format(PyExc_ValueError, "capture facts: %s at byte %zd", what, (Py_ssize_t)(d->p - d->start));
    return NULL;
}

static int need(Decoder *d, size_t n) {
    return (size_t)(d->end - d->p) >= n;
}

static uint32_t read_u32(Decoder *d) {
    uint32_t x = 0;
    for (int i = 0; i < 4; i++) x |= (uint32_t)d->p[i] << (8 * i);
    d->p += 4;
    return x;
}

static uint64_t read_u64(Decoder *d) {
    uint64_t x = 0;
    for (int i = 0; i < 8; i++) x |= (uint64_t)d->p[i] << (8 * i);
    d->p += 8;
    return x;
}

static Py_ssize_t number_new(Decoder *d) {
    if (d->count == d->cap) {
        size_t cap = d->cap ? d->cap * 2 : 1024;
        PyObject **memo = PyMem_Realloc(d->memo, cap * sizeof(PyObject *));
        if (memo == NULL) {
            PyErr_NoMemory();
            return -1;
        }
        d->memo = memo;
        d->cap = cap;
    }
    d->memo[d->count] = NULL;
    return (Py_ssize_t)d->count++;
}

static PyObject *decode_value(Decoder *d, int depth) {
    if (!need(d, 1)) return bad(d, "the payload ends inside a value");
    unsigned char tag = *d->p++;
    switch (tag) {
    case 'N': return Py_NewRef(Py_None);
    case 'T': return Py_NewRef(Py_True);
    case 'F': return Py_NewRef(Py_False);
    case 'i':
        if (!need(d, 8)) return bad(d, "the payload ends inside a value");
        return PyLong_FromLongLong((long long)(int64_t)read_u64(d));
    case 'd': {
        if (!need(d, 8)) return bad(d, "the payload ends inside a value");
        uint64_t bits = read_u64(d);
        double x;
        memcpy(&x, &bits, 8);
        return PyFloat_FromDouble(x);
    }
    case 'r': {
        if (!need(d, 4)) return bad(d, "the payload ends inside a value");
        uint32_t number = read_u32(d);
        if (number >= d->count || d->memo[number] == NULL) return bad(d, "a reference to an object not yet decoded");
        return Py_NewRef(d->memo[number]);
    }
    case 'a': case '1': case '2': case '4': case 'b': case 't': break;
    default:
        d->p--;
        return bad(d, "an unknown tag");
    }
    if (!need(d, 4)) return bad(d, "the payload ends inside a value");
    size_t n = read_u32(d);
    Py_ssize_t number = number_new(d);
    if (number < 0) return NULL;
    PyObject *got;
    if (tag == 't') {
        if (depth >= MAX_DEPTH) return bad(d, "tuples nested too deep");
        if (!need(d, n)) return bad(d, "the payload ends inside a value"); /* each item takes a byte at least */
        got = PyTuple_New((Py_ssize_t)n);
        if (got == NULL) return NULL;
        for (size_t i = 0; i < n; i++) {
            PyObject *item = decode_value(d, depth + 1);
            if (item == NULL) {
                Py_DECREF(got);
                return NULL;
            }
            PyTuple_SET_ITEM(got, (Py_ssize_t)i, item);
        }
    } else {
        size_t width = tag == '2' ? 2 : tag == '4' ? 4 : 1;
        if (n > SIZE_MAX / width || !need(d, n * width)) return bad(d, "the payload ends inside a value");
        const char *s = (const char *)d->p;
        Py_ssize_t len = (Py_ssize_t)(n * width);
        if (tag == 'b') got = PyBytes_FromStringAndSize(s, len);
        else if (tag == 'a') got = PyUnicode_DecodeASCII(s, len, "strict");
        else if (tag == '1') got = PyUnicode_DecodeLatin1(s, len, "strict");
        else {
            int order = -1; /* little-endian */
            got = tag == '2' ? PyUnicode_DecodeUTF16(s, len, "surrogatepass", &order)
                             : PyUnicode_DecodeUTF32(s, len, "surrogatepass", &order);
        }
        if (got == NULL) return NULL;
        d->p += len;
    }
    d->memo[number] = Py_NewRef(got);
    return got;
}

static PyObject *fw_decode(PyObject *self, PyObject *arg) {
    Py_buffer view;
    if (PyObject_GetBuffer(arg, &view, PyBUF_SIMPLE) < 0) return NULL;
    Decoder d = {view.buf, (const unsigned char *)view.buf + view.len, view.buf, NULL, 0, 0};
    PyObject *rows = NULL;
    if (view.len < 8 || memcmp(view.buf, MAGIC, 4) != 0) {
        PyErr_SetString(PyExc_ValueError, "capture facts: not a facts payload");
        goto done;
    }
    d.p += 4;
    uint32_t n = read_u32(&d);
    if (!need(&d, n)) { /* each row takes a byte at least */
        bad(&d, "the payload ends inside a value");
        goto done;
    }
    rows = PyList_New(n);
    if (rows == NULL) goto done;
    for (uint32_t i = 0; i < n; i++) {
        PyObject *row = decode_value(&d, 0);
        if (row == NULL) {
            Py_CLEAR(rows);
            goto done;
        }
        PyList_SET_ITEM(rows, i, row);
    }
    if (d.p != d.end) {
        PyErr_Format(PyExc_ValueError, "capture facts: %zd bytes after the last row", (Py_ssize_t)(d.end - d.p));
        Py_CLEAR(rows);
    }
done:
    for (size_t i = 0; i < d.count; i++) Py_XDECREF(d.memo[i]);
    PyMem_Free(d.memo);
    PyBuffer_Release(&view);
    return rows;
}

static PyMethodDef methods[] = {
    {"encode", fw_encode, METH_O, "encode(rows) -> payload bytes, or None where a value cannot be encoded"},
    {"write", fw_write, METH_VARARGS, "write(fd, rows) -> True once written as one message; False if not encodable"},
    {"decode", fw_decode, METH_O, "decode(payload) -> the rows"},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef module = {PyModuleDef_HEAD_INIT, "_facts_wire", "Capture facts encoded off the GIL.", -1,
                                    methods};

PyMODINIT_FUNC PyInit__facts_wire(void) {
    return PyModule_Create(&module);
}
