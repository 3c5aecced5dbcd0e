#include "shims.h"
