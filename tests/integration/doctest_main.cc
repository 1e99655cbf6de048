// doctest's runner and main(), compiled once for every integration test program rather
// than once in each (it is the heaviest part of a test's compile). A test with a main()
// of its own (membership_it) does not link it.
#define DOCTEST_CONFIG_IMPLEMENT_WITH_MAIN
#include <doctest/doctest.h>
