#include "core/thread_name.h"

#include <pthread.h>

#include <cstring>

namespace kstate {

void name_this_thread(const char* name) noexcept {
  char buf[16];
  std::strncpy(buf, name, sizeof buf - 1);
  buf[sizeof buf - 1] = '\0';
  (void)pthread_setname_np(pthread_self(), buf);  // a name is a convenience: a failure changes nothing
}

}  // namespace kstate
