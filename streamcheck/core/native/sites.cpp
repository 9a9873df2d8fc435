// SiteResolver.__call__'s walk of the calling thread's Python frames in C (streamcheck/core/trace.py is the
// reference and the fallback): a recorder names the call site of every operation it records, and the walk in
// Python costs 2-3 µs, a tenth of that here. Each walked call path is interned as a stack id; Python turns an id
// into its CallSite once (SiteResolver.site_of), so the sites are the Python walk's own objects.
//
// Walker(classify, depth): classify(code) -> its kind (SiteResolver.code_kind), asked once per code object;
// `depth`: SiteSettings.depth. walk(skip, limit) -> the stack id of the caller's frames (`skip` innermost frames
// left out: the resolver's own), 0 where no frame is kept; stack(id) -> ((code, offset), ...), the user's frame's
// index (-1: none); reset(depth) forgets the kinds and stacks (other site settings). Called with the GIL held.
#define PY_SSIZE_T_CLEAN
#define Py_BUILD_CORE 1
#include <Python.h>

#include "frames.h"

#ifdef Py_GIL_DISABLED
#error "the walker's tables rely on the GIL; a free-threaded Python walks in Python"
#endif

#include <cstdint>
#include <unordered_map>
#include <vector>

namespace {

using namespace streamcheck_frames;

struct Walker {
  PyObject_HEAD
  PyObject* classify;  // code -> kind
  int depth;
  std::unordered_map<PyObject*, uint8_t>* kinds;  // code object (a reference held) -> kind
  StackTable* stacks;
  uint64_t generation;  // forget()s so far
};

void forget(Walker* self) {
  ++self->generation;
  for (auto& [code, kind] : *self->kinds) Py_DECREF(code);
  self->kinds->clear();
  self->stacks->clear();
}

// The kind of `code`, asking classify the first time; `failed` set where it raised (its error stays set).
uint8_t kind_of(Walker* self, PyObject* code, bool& failed) {
  if (failed) return kMachinery;  // an error is set: no more Python until the walk returns it
  auto found = self->kinds->find(code);
  if (found != self->kinds->end()) return found->second;
  if (self->classify == nullptr) {  // cleared by the GC: nothing to ask
    PyErr_SetString(PyExc_RuntimeError, "Walker: its classify function is gone");
    failed = true;
    return kMachinery;
  }
  PyObject* result = PyObject_CallOneArg(self->classify, code);
  if (result == nullptr) {
    failed = true;
    return kMachinery;
  }
  long kind = PyLong_AsLong(result);
  Py_DECREF(result);
  if (kind < kMachinery || kind > kForwards) {
    if (!PyErr_Occurred()) PyErr_Format(PyExc_ValueError, "classify gave %ld, not a frame kind", kind);
    failed = true;
    return kMachinery;
  }
  Py_INCREF(code);  // held while classified: no later code object takes its address
  self->kinds->emplace(code, static_cast<uint8_t>(kind));
  return static_cast<uint8_t>(kind);
}

PyObject* walker_new(PyTypeObject* type, PyObject* args, PyObject* kwargs) {
  static const char* names[] = {"classify", "depth", nullptr};
  PyObject* classify = nullptr;
  int depth = 8;
  if (!PyArg_ParseTupleAndKeywords(args, kwargs, "O|i", const_cast<char**>(names), &classify, &depth)) return nullptr;
  if (!PyCallable_Check(classify)) {
    PyErr_SetString(PyExc_TypeError, "Walker: classify must be callable");
    return nullptr;
  }
  auto* self = reinterpret_cast<Walker*>(type->tp_alloc(type, 0));
  if (self == nullptr) return nullptr;
  Py_INCREF(classify);
  self->classify = classify;
  self->depth = depth < 1 ? 1 : depth;
  self->kinds = new std::unordered_map<PyObject*, uint8_t>();
  self->stacks = new StackTable();
  self->generation = 0;
  return reinterpret_cast<PyObject*>(self);
}

// classify is a resolver's bound method, and the resolver holds its walker: a cycle the GC must see.
int walker_traverse(PyObject* obj, visitproc visit, void* arg) {
  Py_VISIT(Py_TYPE(obj));
  Py_VISIT(reinterpret_cast<Walker*>(obj)->classify);
  return 0;
}

int walker_clear(PyObject* obj) {
  Py_CLEAR(reinterpret_cast<Walker*>(obj)->classify);
  return 0;
}

void walker_dealloc(PyObject* obj) {
  auto* self = reinterpret_cast<Walker*>(obj);
  PyObject_GC_UnTrack(obj);
  forget(self);
  delete self->kinds;
  delete self->stacks;
  walker_clear(obj);
  PyTypeObject* type = Py_TYPE(obj);
  type->tp_free(obj);
  Py_DECREF(type);
}

PyObject* walker_walk(PyObject* obj, PyObject* const* args, Py_ssize_t nargs) {
  auto* self = reinterpret_cast<Walker*>(obj);
  long skip = 0, limit = 64;
  if (nargs > 0 && (skip = PyLong_AsLong(args[0])) == -1 && PyErr_Occurred()) return nullptr;
  if (nargs > 1 && (limit = PyLong_AsLong(args[1])) == -1 && PyErr_Occurred()) return nullptr;
  PyFrame* first = first_frame(PyThreadState_Get());
  for (long i = 0; i < skip && first != nullptr; ++i) first = back(first);
  std::vector<uint64_t> key;
  key.reserve(24);
  // classify runs Python, where another thread may reset the walker (other site settings): the kinds of the codes
  // walked so far are forgotten, and with them the references that keep their addresses theirs. Walk again then.
  uint64_t generation;
  do {
    generation = self->generation;
    key.clear();
    bool failed = false;
    walk_frames(first, static_cast<int>(limit), self->depth,
                [self, &failed](PyObject* code) { return kind_of(self, code, failed); }, key);
    if (failed) return nullptr;  // classify's error goes to the caller
  } while (generation != self->generation);
  if (key.size() == 1) return PyLong_FromLong(0);  // only the user's index: no frame kept
  return PyLong_FromUnsignedLong(self->stacks->intern(std::move(key)));
}

PyObject* walker_stack(PyObject* obj, PyObject* arg) {
  auto* self = reinterpret_cast<Walker*>(obj);
  unsigned long id = PyLong_AsUnsignedLong(arg);
  if (id == static_cast<unsigned long>(-1) && PyErr_Occurred()) return nullptr;
  const std::vector<uint64_t>* key = self->stacks->key(static_cast<uint32_t>(id));
  if (key == nullptr) {
    PyErr_Format(PyExc_KeyError, "no stack %lu", id);
    return nullptr;
  }
  return stack_tuple(*key);  // its codes held by kinds since they were classified
}

PyObject* walker_reset(PyObject* obj, PyObject* arg) {
  auto* self = reinterpret_cast<Walker*>(obj);
  long depth = PyLong_AsLong(arg);
  if (depth == -1 && PyErr_Occurred()) return nullptr;
  forget(self);
  self->depth = depth < 1 ? 1 : static_cast<int>(depth);
  Py_RETURN_NONE;
}

// This thread's frames as the walk reads them, innermost first, (code, offset) each: the self-check at import
// compares them with sys._getframe()'s.
PyObject* frames_here(PyObject*, PyObject*) {
  PyObject* out = PyList_New(0);
  if (out != nullptr && append_frames(PyThreadState_Get(), out) != 0) Py_CLEAR(out);
  return out;
}

PyMethodDef walker_methods[] = {
    {"walk", reinterpret_cast<PyCFunction>(reinterpret_cast<void (*)()>(walker_walk)), METH_FASTCALL,
     "walk(skip=0, limit=64): the stack id of the calling frames (0: none kept)."},
    {"stack", walker_stack, METH_O, "stack(id): ((code, offset), ...) innermost first, and the user's index (-1: none)."},
    {"reset", walker_reset, METH_O, "reset(depth): forget the frames' kinds and the stacks."},
    {nullptr, nullptr, 0, nullptr},
};

PyType_Slot walker_slots[] = {
    {Py_tp_new, reinterpret_cast<void*>(walker_new)},
    {Py_tp_dealloc, reinterpret_cast<void*>(walker_dealloc)},
    {Py_tp_traverse, reinterpret_cast<void*>(walker_traverse)},
    {Py_tp_clear, reinterpret_cast<void*>(walker_clear)},
    {Py_tp_methods, walker_methods},
    {Py_tp_doc, const_cast<char*>("SiteResolver.__call__'s walk of the calling thread's frames, in C.")},
    {0, nullptr},
};

PyType_Spec walker_spec = {"streamcheck.core._sites_native.Walker", sizeof(Walker), 0,
                           Py_TPFLAGS_DEFAULT | Py_TPFLAGS_HAVE_GC, walker_slots};

PyMethodDef module_methods[] = {
    {"frames_here", frames_here, METH_NOARGS, "This thread's frames as the walk reads them: [(code, offset), ...]."},
    {nullptr, nullptr, 0, nullptr},
};

PyModuleDef module_def = {
    PyModuleDef_HEAD_INIT, "_sites_native",
    "SiteResolver's walk of the calling thread's frames in C (streamcheck.core.trace uses it; its Python walk is "
    "the reference).",
    -1, module_methods,
};

}  // namespace

PyMODINIT_FUNC PyInit__sites_native(void) {
  PyObject* module = PyModule_Create(&module_def);
  if (module == nullptr) return nullptr;
#ifdef SOURCE_SHA256
  if (PyModule_AddStringConstant(module, "SOURCE_SHA256", SOURCE_SHA256) < 0) {  // setup.py's hash of the sources
    Py_DECREF(module);
    return nullptr;
  }
#endif
  PyObject* type = PyType_FromSpec(&walker_spec);
  if (type == nullptr || PyModule_AddObject(module, "Walker", type) < 0) {
    Py_XDECREF(type);
    Py_DECREF(module);
    return nullptr;
  }
  return module;
}
