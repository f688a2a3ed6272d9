package dra

// SocketsOf is socketsOf, for the tests.
var SocketsOf = socketsOf
