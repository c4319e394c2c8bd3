/* Paces a thread: at the end of each slice of wall time in which it ran, a timer signal makes it nap, wherever
 * it is, in Python or deep inside a C call (capture.pacing.Pacer is the Python side, and its reference).
 *
 * Why: on a machine whose few cores the proxy, its clients and the broker keep busy, a writer process
 * building a batch (a few ms) or writing a row group (30 ms and more in one pyarrow call) held its core in
 * one stretch, and the round trips in flight meanwhile came back late: +1 to +3 ms at p99 under eight
 * connections, at nice +10 and under SCHED_IDLE alike. A process busy for 0.2-0.3 ms at a time with short naps
 * between costs them far less at the same share of the CPU (docs/performance.md, twentieth section):
 * each nap leaves its core idle, and the scheduler moves a waiting task there at once. Python cannot
 * interrupt a C call, so the nap happens in a signal handler (nanosleep is async-signal-safe).
 *
 * arm(slice_ns, nap_ns, idle_only=False): from now on the calling thread naps nap_ns at the end of every
 *   slice_ns (wall time) in which it ran at least half a slice of CPU (a CLOCK_MONOTONIC timer signalling that
 *   thread alone, set again after each slice; arming from another thread moves the pacing there); with
 *   idle_only, only while the thread is in the idle scheduling class.
 * disarm(): no more naps (a signal already sent may still give one).
 * naps() -> int: the naps taken in this process so far. */

#define _GNU_SOURCE
#define PY_SSIZE_T_CLEAN
#include <Python.h>

#include <errno.h>
#include <sched.h>
#include <signal.h>
#include <stdatomic.h>
#include <string.h>
#include <sys/prctl.h>
#include <sys/syscall.h>
#include <time.h>
#include <unistd.h>

#ifndef sigev_notify_thread_id /* glibc before 2.35 names the field only inside the union */
#define sigev_notify_thread_id _sigev_un._tid
#endif

#define PACE_SIGNAL (SIGRTMIN + 4) /* a real-time signal: nothing in CPython or its libraries uses it */

static struct timespec nap;
static long long work_ns; /* the CPU a slice must have used for a nap: half a slice */
static long long cpu_mark_ns; /* the thread's CPU time as its slice began */
static int idle_only; /* nap only while the thread is in the idle class */
static struct itimerspec every; /* one slice, no interval: on_slice sets it going again after its nap */
static volatile sig_atomic_t armed; /* cleared before disarming: a signal still pending then does not re-arm */
static atomic_long naps;
static timer_t timer;
static int timer_made, handler_set;
static pid_t timer_tid, timer_pid; /* the thread the timer signals, in the process that made it (fork) */

static long long thread_cpu_ns(void) /* clock_gettime is async-signal-safe */
{
    struct timespec t;
    clock_gettime(CLOCK_THREAD_CPUTIME_ID, &t);
    return (long long)t.tv_sec * 1000000000LL + t.tv_nsec;
}

static void on_slice(int signo)
{
    (void)signo;
    int saved = errno; /* the interrupted code may be about to read it */
    /* A slice the thread spent mostly waiting for a core (blocked, or behind busier tasks) ends without a
     * nap: napping then would only add to the wait, and a thread always waiting longer than a slice for its
     * core (in the idle class on busy cores) would nap each time it got one and never work. */
    /* idle_only: a writer the proxy has lifted out of the idle class because it fell behind (the normal class, at
     * nice +10) must catch up: beside busy tasks, each nap would hand its core back for a whole turn. The raw
     * system call: a few hundred ns a slice, and nothing of glibc's that is not async-signal-safe. */
    if (thread_cpu_ns() - cpu_mark_ns >= work_ns &&
        (!idle_only || syscall(SYS_sched_getscheduler, 0) == SCHED_IDLE)) {
        nanosleep(&nap, NULL); /* cut short by another signal: the next slice naps again */
        atomic_fetch_add_explicit(&naps, 1, memory_order_relaxed);
    }
    cpu_mark_ns = thread_cpu_ns();
    /* The next slice counts from the end of this one's nap: a timer firing every slice would find a nap as
     * long as the slice (with the kernel's timer slack) always due, and the thread would never work again. */
    if (armed)
        timer_settime(timer, 0, &every, NULL);
    errno = saved;
}

static struct timespec from_ns(long long ns)
{
    struct timespec t = {(time_t)(ns / 1000000000LL), (long)(ns % 1000000000LL)};
    return t;
}

static int set_handler(void)
{
    struct sigaction old, sa;
    if (sigaction(PACE_SIGNAL, NULL, &old))
        return -1;
    if (old.sa_handler != SIG_DFL && old.sa_handler != on_slice) {
        PyErr_SetString(PyExc_RuntimeError, "capture pacing: its signal (SIGRTMIN+4) is already in use");
        return -2;
    }
    memset(&sa, 0, sizeof sa);
    sa.sa_handler = on_slice;
    sa.sa_flags = SA_RESTART; /* a read or a write it interrupts carries on */
    sigemptyset(&sa.sa_mask);
    return sigaction(PACE_SIGNAL, &sa, NULL);
}

static PyObject *arm(PyObject *self, PyObject *args)
{
    long long slice_ns, nap_ns;
    int only_idle = 0;
    (void)self;
    if (!PyArg_ParseTuple(args, "LL|p:arm", &slice_ns, &nap_ns, &only_idle))
        return NULL;
    if (slice_ns <= 0 || nap_ns <= 0 || nap_ns >= 1000000000LL) {
        PyErr_SetString(PyExc_ValueError, "capture pacing: the slice must be positive and the nap under a second");
        return NULL;
    }
    if (!handler_set) {
        int failed = set_handler();
        if (failed == -2)
            return NULL;
        if (failed)
            return PyErr_SetFromErrno(PyExc_OSError);
        handler_set = 1;
    }
    pid_t tid = (pid_t)syscall(SYS_gettid), pid = getpid();
    if (timer_made && (timer_tid != tid || timer_pid != pid)) {
        if (timer_pid == pid)
            timer_delete(timer);
        timer_made = 0; /* a forked child inherits the variables, never the timer */
    }
    if (!timer_made) {
        /* Naps of nap_ns, not nap_ns plus Linux's default 50 us of timer slack: each nap is CPU the writer does
         * not get back (0.1 ms naps took 0.15). The select() between batches sleeps as precisely, which costs
         * nothing at its 0.5 s tick. */
        prctl(PR_SET_TIMERSLACK, 1000UL, 0, 0, 0);
        struct sigevent ev;
        memset(&ev, 0, sizeof ev);
        ev.sigev_notify = SIGEV_THREAD_ID;
        ev.sigev_signo = PACE_SIGNAL;
        ev.sigev_notify_thread_id = tid;
        if (timer_create(CLOCK_MONOTONIC, &ev, &timer))
            return PyErr_SetFromErrno(PyExc_OSError);
        timer_made = 1;
        timer_tid = tid;
        timer_pid = pid;
    }
    armed = 0; /* re-armed with these settings: no handler may use them half set */
    nap = from_ns(nap_ns);
    work_ns = slice_ns / 2;
    idle_only = only_idle;
    cpu_mark_ns = thread_cpu_ns();
    memset(&every, 0, sizeof every);
    every.it_value = from_ns(slice_ns);
    armed = 1;
    if (timer_settime(timer, 0, &every, NULL)) {
        armed = 0;
        return PyErr_SetFromErrno(PyExc_OSError);
    }
    Py_RETURN_NONE;
}

static PyObject *disarm(PyObject *self, PyObject *unused)
{
    (void)self;
    (void)unused;
    armed = 0;
    if (timer_made && timer_pid == getpid()) {
        struct itimerspec never;
        memset(&never, 0, sizeof never);
        if (timer_settime(timer, 0, &never, NULL))
            return PyErr_SetFromErrno(PyExc_OSError);
    }
    Py_RETURN_NONE;
}

static PyObject *naps_taken(PyObject *self, PyObject *unused)
{
    (void)self;
    (void)unused;
    return PyLong_FromLong(atomic_load_explicit(&naps, memory_order_relaxed));
}

static PyMethodDef methods[] = {
    {"arm", arm, METH_VARARGS, "arm(slice_ns, nap_ns, idle_only=False): the calling thread naps nap_ns after each "
                               "slice_ns it ran (with idle_only, while it is in the idle scheduling class)."},
    {"disarm", disarm, METH_NOARGS, "No more naps."},
    {"naps", naps_taken, METH_NOARGS, "The naps taken in this process so far."},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef module_def = {
    PyModuleDef_HEAD_INIT, "kinspect.capture._pace",
    "Paces a thread with short naps between slices of its work, even inside C calls (capture.pacing).",
    -1, methods};

PyMODINIT_FUNC PyInit__pace(void)
{
    return PyModule_Create(&module_def);
}
