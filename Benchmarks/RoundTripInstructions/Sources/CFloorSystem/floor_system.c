// Headers only (include/floor_system.h); SwiftPM needs a source file for a C target.
#include "floor_system.h"
