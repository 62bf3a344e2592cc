/* Build-time stand-in for a libstdc++ newer than any real one (GLIBCXX_3.4.99). */
int seedance_future_cxx_call(void) { return 2; }
