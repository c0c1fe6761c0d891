def problem_exception_handler(exc, context):
    from rest_framework.views import exception_handler
    return exception_handler(exc, context)
