/* Where a slotted class keeps each object slot, from its member descriptors: the C extensions that
 * read or fill kinspect's events and facts at their slots (session._one_frame, observers._counting,
 * capture._take) find the offsets once, when they are made, and fail then if a class lost a slot. */
#ifndef KINSPECT_SLOT_OFFSETS_H
#define KINSPECT_SLOT_OFFSETS_H

#include <Python.h>
#include <structmember.h>

/* The object in a slot (borrowed; NULL when the slot was never set). */
#define SLOT(obj, off) (*(PyObject **)((char *)(obj) + (off)))

/* Set a slot to a new reference (stolen), dropping what it held. */
static inline void set_slot(PyObject *obj, Py_ssize_t off, PyObject *value)
{
    PyObject *old = SLOT(obj, off);
    SLOT(obj, off) = value;
    Py_XDECREF(old);
}

/* The offset of a writable object slot `name` of a class, or -1 with a TypeError set. */
static Py_ssize_t slot_offset(PyTypeObject *tp, const char *name)
{
    PyObject *descr = PyDict_GetItemString(tp->tp_dict, name); /* borrowed */
    if (descr == NULL || !Py_IS_TYPE(descr, &PyMemberDescr_Type)) {
        PyErr_Format(PyExc_TypeError, "kinspect: %s has no slot %s", tp->tp_name, name);
        return -1;
    }
    PyMemberDef *m = ((PyMemberDescrObject *)descr)->d_member;
    if (m->type != T_OBJECT_EX || m->offset <= 0 || m->offset + (Py_ssize_t)sizeof(PyObject *) > tp->tp_basicsize) {
        PyErr_Format(PyExc_TypeError, "kinspect: %s.%s is not an object slot", tp->tp_name, name);
        return -1;
    }
    return m->offset;
}

/* The offsets of `count` slots, by name, into out; -1 with a TypeError set if one is missing. */
static int find_offsets(PyTypeObject *tp, const char *const *names, int count, Py_ssize_t *out)
{
    for (int i = 0; i < count; i++) {
        if ((out[i] = slot_offset(tp, names[i])) < 0)
            return -1;
    }
    return 0;
}

/* Whether a bool attribute is True: loaded from its slot at `off` when obj is a `tp` (or a subclass, which keeps
 * the slot where tp has it), else looked up by `name` (a stand-in). 1, 0, or -1 with an error set. */
static inline int slot_or_attr_true(PyObject *obj, PyTypeObject *tp, Py_ssize_t off, PyObject *name)
{
    PyObject *flag = tp != NULL && PyObject_TypeCheck(obj, tp) ? SLOT(obj, off) : NULL;
    if (flag == Py_True || flag == Py_False)
        return flag == Py_True;
    flag = PyObject_GetAttr(obj, name);
    int is = flag == NULL ? -1 : PyObject_IsTrue(flag);
    Py_XDECREF(flag);
    return is;
}

#endif
