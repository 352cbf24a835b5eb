// Boost 1.74's Asio uses std::exchange without including <utility>, which
// breaks under C++20 with GCC 12: include Asio only through this header.
#pragma once

#include <utility>

#include <boost/asio.hpp>
